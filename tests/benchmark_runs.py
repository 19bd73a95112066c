"""A benchmark module run as a process of its own, as its README command runs it: the benchmarks set
process-wide TensorFlow state (eager mode, determinism, logical devices) that the suite's process must not get.

    run_benchmark("tf2", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["tf2"])   # exits 0, or the test fails

Runs never overlap: each holds a lock file while it runs, so two smoke runs (or two suites on one machine)
take turns instead of sharing the cores, and a run's duration is its own work. The bound on a run only
catches a hang: HANG_FACTOR times the run's wall time on a quiet 2-core machine (SMOKE_SECONDS), which a
run on a loaded machine stays far below.
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

# Each smoke run's wall seconds on a quiet 2-core machine, estimated from runs one at a time on a shared one
# (2026-11-28): the larger of its CPU seconds (user + system, children included: a quiet machine's wall time
# for work that does not wait) and its shortest wall time measured (runs that wait on an emulated device or
# a storage latency take longer than their CPU time). Re-measure with
#     /usr/bin/time -f "%e s wall, %U+%S s CPU" python -m benchmarks.<module> <arguments> --out /tmp/smoke
SMOKE_SECONDS = {
    "e2e": 80.0,                 # e2e --smoke: 49 s CPU; 77 s wall at load 2.2
    "e2e --accelerator": 40.0,   # e2e --accelerator --smoke: 23 s CPU; 38 s wall at load 4.4
    "scaling": 25.0,             # scaling --smoke: 20-23 s CPU; 22 s wall at load 2.3
    "ports": 40.0,               # ports --smoke: 32 s CPU; 38 s wall at load 2.8
    "tf2": 45.0,                 # tf2 --smoke: 17 s CPU; 45 s wall at load 3.9
    # no run near quiet for these two: CPU seconds plus the emulated device's waits, ~28 s a kind (tf2's)
    "tf2 --kinds": 230.0,        # tf2 --smoke --kinds <the four Keras kinds>: 111 s CPU; 427 s wall at load 5.9
    "tf2_strategy": 120.0,       # tf2_strategy --smoke (two kinds): 61 s CPU; 188 s wall at load 6.0
    "accelerator_probe": 35.0,   # accelerator_probe --smoke --points auto,1s,2o: 12 s CPU; 33 s wall at load 5.4
    "second_session": 60.0,      # second_session --smoke: 49 s CPU; 165 s wall at load 6.9
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
