"""A loopback cluster: a trainer server and N input-task servers, each a subprocess on 127.0.0.1.

    with LoopbackCluster(input_job="input", tasks=2) as cluster:     # started, every task answering
        tf.compat.v1.Session(cluster.target, ...)                    # "grpc://127.0.0.1:<trainer port>"
    # left: every server process is killed, also on an error or Ctrl-C

What `smartstage verify` runs a graph placed on input tasks on (docs/inspect.md), and what the cluster tests
start their input tasks with. Each server is `python -m smartstage.inspection.loopback JOB INDEX SPEC LIFETIME
PARENT_PID`: it prints one line when its server listens and exits by itself when its parent is gone or its
lifetime is over, so a killed `verify` leaves nothing behind. Every wait is bounded; a server that does not
start in time (or exits: its port was taken) is a LoopbackClusterError naming it.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

from smartstage.errors import SmartStageError

logger = logging.getLogger(__name__)

TRAINER_JOB = "trainer"
START_SECONDS = 60.0      # a server that has not printed its line by then did not start
LIFETIME_SECONDS = 900.0  # a server ends by itself after this long, whatever happens to its parent
READY = "smartstage-loopback-ready"


class LoopbackClusterError(SmartStageError):
    """A server of the loopback cluster did not start (in time, or at all); the message names it."""


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (free when asked: a server may still lose one to a race)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def server_command(job: str, index: int, spec: dict, lifetime: float = LIFETIME_SECONDS) -> list[str]:
    """The command line of one server process of `spec` (a ClusterSpec as a dict of address lists)."""
    return [sys.executable, "-m", "smartstage.inspection.loopback", job, str(index), json.dumps(spec), str(lifetime),
            str(os.getpid())]


def server_env() -> dict:
    """The servers' environment: quiet TensorFlow, CPU only, this package importable."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


class LoopbackCluster:
    """{"trainer": [address], input_job: [N addresses]}, every server a subprocess; see the module docstring."""

    def __init__(self, input_job: str, tasks: int, *, start_seconds: float = START_SECONDS,
                 lifetime: float = LIFETIME_SECONDS):
        if tasks < 1:
            raise LoopbackClusterError(f"a loopback cluster needs at least one input task, got tasks={tasks}")
        if input_job == TRAINER_JOB:
            raise LoopbackClusterError(f"input_job {input_job!r} is the loopback trainer's own job name; "
                                       "name the input job otherwise (e.g. 'input')")
        self.input_job, self.tasks = input_job, tasks
        self.start_seconds, self.lifetime = start_seconds, lifetime
        self.spec: dict[str, list[str]] = {}
        self.processes: list[tuple[str, subprocess.Popen, object]] = []  # (task name, process, its stderr file)

    @property
    def target(self) -> str:
        """The session target of the trainer's server."""
        return "grpc://" + self.spec[TRAINER_JOB][0]

    def start(self) -> "LoopbackCluster":
        """Starts every server and waits (bounded) until each listens; on any failure kills them all."""
        try:
            ports = free_ports(self.tasks + 1)
            self.spec = {TRAINER_JOB: [f"127.0.0.1:{ports[0]}"],
                         self.input_job: [f"127.0.0.1:{p}" for p in ports[1:]]}
            for job, addresses in self.spec.items():
                for index in range(len(addresses)):
                    stderr = tempfile.TemporaryFile(mode="w+", prefix="smartstage-loopback-")
                    process = subprocess.Popen(server_command(job, index, self.spec, self.lifetime),
                                               env=server_env(), stdout=subprocess.PIPE, stderr=stderr,
                                               text=True, start_new_session=True)  # Ctrl-C reaches us, not them
                    self.processes.append((f"/job:{job}/task:{index} ({addresses[index]})", process, stderr))
            deadline = time.monotonic() + self.start_seconds
            for name, process, stderr in self.processes:
                self._wait_ready(name, process, stderr, deadline)
            logger.info("loopback cluster up: %s", self.spec)
            return self
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, name: str, process: subprocess.Popen, stderr, deadline: float) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LoopbackClusterError(f"loopback cluster: server {name} did not start within "
                                           f"{self.start_seconds:.0f} s (a loaded machine: allow more with verify "
                                           "--start-timeout SECONDS)")
            readable, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
            if readable:
                line = process.stdout.readline()
                if line.startswith(READY):
                    return
                if line:
                    continue
            if process.poll() is not None:
                raise LoopbackClusterError(f"loopback cluster: server {name} exited before it started (exit "
                                           f"{process.returncode}): {_last_line(stderr)}")

    def close(self) -> None:
        """Kills every server (idempotent); waits a bounded time for each to go."""
        for _, process, stderr in self.processes:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                logger.warning("loopback server %d still running 10 s after kill", process.pid)
            if process.stdout is not None:
                process.stdout.close()
            stderr.close()
        self.processes = []

    def __enter__(self) -> "LoopbackCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _last_line(stderr) -> str:
    stderr.seek(0)
    lines = [line.strip() for line in stderr.read().splitlines() if line.strip()]
    useful = [line for line in lines if "port" in line.lower() or "address" in line.lower() or "rror" in line]
    text = (useful or lines or ["(no output)"])[-1]
    if "address already in use" in text.lower() or "could not start" in text.lower():
        text = f"its port is unavailable ({text[:200]})"
    return text[:300]


def serve(argv: list[str]) -> None:
    """One server: `JOB INDEX SPEC LIFETIME PARENT_PID`; prints READY when it listens, ends with its parent."""
    job, index, spec, lifetime, parent = argv[0], int(argv[1]), json.loads(argv[2]), float(argv[3]), int(argv[4])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if os.getppid() != parent:  # the parent died while TensorFlow was loading
        os._exit(0)
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index)
    print(f"{READY} {job} {index} {server.target}", flush=True)
    end = time.monotonic() + lifetime
    while time.monotonic() < end and os.getppid() == parent:  # a new parent: ours is gone
        time.sleep(0.2)
    os._exit(0)  # a tf.distribute.Server has no shutdown; leave at once


if __name__ == "__main__":
    serve(sys.argv[1:])
