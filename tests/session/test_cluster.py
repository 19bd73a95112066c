"""Training with the flag on a local cluster: one parameter server and two workers on loopback.

Each task is its own process (tests/session/cluster_task.py) with its own graph under
replica_device_setter. Every wait is bounded, and the test stops every process it started.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bounds import JOB_HANG_SECONDS
from tests.cluster.cluster import free_ports

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
BOUND_SECONDS = JOB_HANG_SECONDS
STEPS = 20


def start(job: str, index: int, cluster: dict, run_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.session.cluster_task", job, str(index), json.dumps(cluster), str(run_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def report(process: subprocess.Popen, deadline: float, what: str) -> dict:
    try:
        out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop(process)
        out, err = process.communicate(timeout=10)
        pytest.fail(f"{what} did not finish within {BOUND_SECONDS:.0f} s; stderr tail:\n{err[-3000:]}")
    assert process.returncode == 0, f"{what} failed (exit {process.returncode}); stderr tail:\n{err[-3000:]}"
    print(f"{what}:\n" + "\n".join(line for line in err.splitlines() if line.startswith("[")))
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"{what} printed no report; stdout:\n{out[-2000:]}"
    return json.loads(lines[-1])


def test_two_workers_train_with_the_flag_each_with_its_own_prefetch_side(tmp_path):
    ps_port, w0_port, w1_port = free_ports(3)
    cluster = {"ps": [f"127.0.0.1:{ps_port}"], "worker": [f"127.0.0.1:{w0_port}", f"127.0.0.1:{w1_port}"]}
    processes = []
    try:
        processes.append(start("ps", 0, cluster, tmp_path))
        workers = [start("worker", i, cluster, tmp_path) for i in (0, 1)]
        processes.extend(workers)
        deadline = time.monotonic() + BOUND_SECONDS
        reports = [report(w, deadline, f"worker {i}") for i, w in enumerate(workers)]
    finally:
        for process in processes:
            stop(process)

    for index, seen in enumerate(reports):
        own_task = f"/job:worker/task:{index}"
        assert set(seen["stage_devices"]) == {"buffer", "put", "take", "close", "cancel", "size"}
        assert all(device == own_task for device in seen["stage_devices"].values()), seen["stage_devices"]
        assert seen["moved_devices"] == [own_task]
        assert seen["variable_devices"] == ["/job:ps/task:0"]
        assert len(seen["losses"]) == STEPS and all(math.isfinite(x) for x in seen["losses"])
