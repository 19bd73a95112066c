"""A benchmark module run as a process of its own, as its README command runs it: the benchmarks set
process-wide TensorFlow state (eager mode, determinism, logical devices) that the suite's process must not get.

    run_benchmark("tf2", tmp_path, "--smoke")    # python -m benchmarks.tf2 --smoke --out <tmp_path>, exits 0
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(module: str, out: Path, *arguments: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m benchmarks.<module> <arguments> --out <out>` from the repository root, its output captured;
    fails the test with the end of its stderr unless it exits 0."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *arguments, "--out", str(out)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
