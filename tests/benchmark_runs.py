"""A benchmark module run as a process of its own, as its README command runs it: the benchmarks set
process-wide TensorFlow state (eager mode, determinism, logical devices) that the suite's process must not get.

    run_benchmark("tf2", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["tf2"])   # exits 0, or the test fails

Runs never overlap: each holds a lock file while it runs, so two smoke runs (or two suites on one machine)
take turns instead of sharing the cores, and a run's duration is its own work. The bound on a run only
catches a hang: HANG_FACTOR times the run's wall time on a quiet 2-core machine (SMOKE_SECONDS), and never
less than any child process that imports TensorFlow gets (tests/bounds.py), so a run on a loaded machine
stays far below it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bounds import JOB_HANG_SECONDS

REPO_ROOT = Path(__file__).resolve().parent.parent
HANG_FACTOR = 20

# Each smoke run's wall seconds on a quiet 2-core machine, estimated from runs one at a time on a shared one
# (2026-11-28, some at nice -15): the larger of its CPU seconds (user + system, children included: the wall
# time of work that does not wait) and its shortest wall time measured (runs that wait on an emulated device
# or a storage latency take longer than their CPU time), rounded up. Re-measure with
#     /usr/bin/time -f "%e s wall, %U+%S s CPU" python -m benchmarks.<module> <arguments> --out /tmp/smoke
SMOKE_SECONDS = {
    "e2e": 80.0,                 # e2e --smoke: 44-49 s CPU; 77 s wall at load 2.2
    "e2e --accelerator": 40.0,   # e2e --accelerator --smoke: 23-25 s CPU; 38 s wall at load 4.4
    "scaling": 25.0,             # scaling --smoke: 20-23 s CPU; 22 s wall at load 2.3
    "ports": 40.0,               # ports --smoke: 32-33 s CPU; 38 s wall at load 2.8
    "tf2": 35.0,                 # tf2 --smoke: 17-18 s CPU; 31 s wall at load 8.0, nice -15
    "tf2 --kinds": 350.0,        # tf2 --smoke --kinds <all four>: 111-114 s CPU; 346 s wall at load 8.4, nice -15
    "tf2_routes --kinds keras3_functional": 40.0,  # tf2_routes --smoke --kinds keras3_functional: 31 s CPU;
                                                   # 35 s wall at load 0.4
    "tf2_trial_twin": 20.0,      # tf2_trial_twin --smoke: 8 s CPU; 12 s wall at load 0.5
    "tf2_strategy": 130.0,       # tf2_strategy --smoke (with its control program): 79 s CPU; 81 s wall at load 1.3
    "accelerator_probe": 25.0,   # accelerator_probe --smoke --points auto,1s,2o: 11-12 s CPU; 23 s wall at
                                 # load 7.7, nice -15
    "second_session": 60.0,      # second_session --smoke: 42-49 s CPU; 60 s wall at load 9.3, nice -15
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
    its hang bound (HANG_FACTOR * quiet_seconds, at least JOB_HANG_SECONDS)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-m", f"benchmarks.{module}", *arguments, "--out", str(out)]
    with one_run_at_a_time():
        proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=max(HANG_FACTOR * quiet_seconds, JOB_HANG_SECONDS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
