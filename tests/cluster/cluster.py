"""A loopback cluster for the scale-out tests: a trainer and N input tasks, each in its own process.

Ports are free loopback ports; every process exits by itself (input tasks, started by the package's
launcher smartstage/inspection/loopback.py, after their lifetime or when this process ends; the trainer when done) and is killed by `LoopbackCluster.close()` otherwise. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from smartstage.inspection.loopback import free_ports, server_command  # the launcher `smartstage verify` uses

REPO = Path(__file__).resolve().parents[2]
TASK_LIFETIME_SECONDS = 150


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


class LoopbackCluster:
    """{"trainer": [one address], "input": [N addresses]} with the input tasks started."""

    def __init__(self, tasks: int, lifetime: float = TASK_LIFETIME_SECONDS):
        ports = free_ports(tasks + 1)
        self.spec = {"trainer": [f"127.0.0.1:{ports[0]}"], "input": [f"127.0.0.1:{p}" for p in ports[1:]]}
        # Each input task also ends when this process does (the launcher watches its parent).
        self.inputs = [subprocess.Popen(server_command("input", i, self.spec, lifetime), cwd=REPO, env=_env(),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(tasks)]

    def trainer(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tests.cluster.trainer", json.dumps(self.spec), *args],
                                cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def close(self) -> None:
        for process in self.inputs:
            stop(process)

    def __enter__(self) -> "LoopbackCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def report(process: subprocess.Popen, seconds: float) -> dict:
    """The trainer's JSON line; AssertionError with its stderr when it fails or runs past `seconds`."""
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        stop(process)
        out, err = process.communicate(timeout=10)
        raise AssertionError(f"the trainer did not finish within {seconds:.0f} s; stderr tail:\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, f"trainer failed (exit {process.returncode}):\n{err[-3000:]}"
    return json.loads(lines[-1])


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds:.0f} s"
        time.sleep(0.05)
