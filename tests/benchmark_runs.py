"""A benchmark module run as a process of its own, as its README command runs it: the benchmarks set
process-wide TensorFlow state (eager mode, determinism, logical devices) that the suite's process must not get.

    run_benchmark("tf2", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["tf2"])   # exits 0, or the test fails

Runs never overlap: each holds a lock file while it runs, so two smoke runs (or two suites on one machine)
take turns instead of sharing the cores, and a run's duration is its own work. The bound on a run only
catches a hang: HANG_FACTOR times the CPU seconds the run used on a 2-core machine (SMOKE_SECONDS), far
above its wall time on a quiet machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HANG_FACTOR = 20

# CPU seconds (user + system, the process and its children) of each smoke run, measured one at a time on a
# 2-core machine (2026-11-28; `python -m benchmarks.<module> <arguments>`, tests/benchmark_runs.py's note). A
# run's CPU time is what its wall time is on a quiet machine, within the run's own parallelism.
SMOKE_SECONDS = {
    "e2e": 60.0,                 # e2e --smoke
    "e2e --accelerator": 40.0,   # e2e --accelerator --smoke
    "scaling": 25.0,             # scaling --smoke
    "ports": 40.0,               # ports --smoke
    "tf2": 45.0,                 # tf2 --smoke
    "tf2 --kinds": 300.0,        # tf2 --smoke --kinds <the four Keras kinds>
    "tf2_strategy": 150.0,       # tf2_strategy --smoke
    "accelerator_probe": 35.0,   # accelerator_probe --smoke --points auto,1s,2o
    "second_session": 60.0,      # second_session --smoke
}
LOCK = Path(tempfile.gettempdir()) / "smartstage-benchmark-runs.lock"


@contextlib.contextmanager
def one_run_at_a_time():
    """Holds the machine-wide benchmark lock: other runs wait here until this one ends."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_benchmark(module: str, out: Path, *arguments: str, quiet_seconds: float) -> subprocess.CompletedProcess:
    """`python -m benchmarks.<module> <arguments> --out <out>` from the repository root, its output captured,
    alone on the machine's benchmark lock; fails the test with the end of its stderr unless it exits 0 within
    HANG_FACTOR * quiet_seconds."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-m", f"benchmarks.{module}", *arguments, "--out", str(out)]
    with one_run_at_a_time():
        proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=HANG_FACTOR * quiet_seconds)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
