"""Runs tests/runtime/restore_job.py killed after a checkpoint and resumed, and counts what each record trained.

    counts = kill_and_resume(tmp_path, mode="off", threads=4, capacity=40)
    counts.lost, counts.repeated      # record ids trained 0 times / more than once across the two jobs

Every wait is bounded: each job is a subprocess with a timeout, and a job that outlives it fails the test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.bounds import JOB_HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RestoreCounts:
    """What the kill job and the resumed job trained, counted per record id."""

    records: int
    restored_step: int       # the global step the resumed job started from
    killed_steps: int        # steps the killed job ran (some after its last checkpoint: retrained on resume)
    trained: dict            # id -> times trained by the kept steps
    resumed_ended: bool

    @property
    def lost(self) -> list[int]:
        return [i for i in range(self.records) if self.trained.get(i, 0) == 0]

    @property
    def repeated(self) -> list[int]:
        return [i for i, n in sorted(self.trained.items()) if n > 1]

    def describe(self) -> str:
        return (f"{len(self.lost)} of {self.records} records lost, {len(self.repeated)} trained more than once "
                f"(restored at step {self.restored_step}, the killed job ran {self.killed_steps} steps; lost "
                f"{self.lost[:12]}...)")


def _run(args: list[str], expect_kill: bool, job: str = "tests.runtime.restore_job") -> subprocess.CompletedProcess:
    """Runs the job module `job` with `args`: it must end by SIGKILL (expect_kill) or exit 0, within JOB_HANG_SECONDS."""
    command = [sys.executable, "-m", job, *args]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=JOB_HANG_SECONDS)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{' '.join(command)} ran over {JOB_HANG_SECONDS} s:\n{error.stderr}") from error
    expected = -signal.SIGKILL if expect_kill else 0
    if done.returncode != expected:
        raise AssertionError(f"{' '.join(command)} exited {done.returncode}, expected {expected}:\n"
                             f"{done.stderr[-4000:]}")
    return done


def kill_and_resume(directory: Path, mode: str, threads: int = 1, capacity: int = 4, records: int = 400,
                    tf_data_stage: str = "", session: str = "smartstage", extra: tuple[str, ...] = ()
                    ) -> RestoreCounts:
    """Trains until a checkpoint past step 30, runs 3 steps more, SIGKILL; resumes from the checkpoint to the end.

    session: "smartstage" (smartstage.MonitoredTrainingSession) or "stock" (the stock one with make_prefetch_hook()).
    """
    directory.mkdir(parents=True, exist_ok=True)
    common = ["--mode", mode, "--dir", str(directory), "--threads", str(threads), "--capacity", str(capacity),
              "--records", str(records), "--session", session,
              *(["--tf-data-stage", tf_data_stage] if tf_data_stage else []), *extra]
    _run([*common, "--phase", "kill"], expect_kill=True)
    _run([*common, "--phase", "resume"], expect_kill=False)
    return count(directory / "steps.log", records)


def count(log: Path, records: int) -> RestoreCounts:
    """Counts the ids of the steps a training kept: the killed job's up to the restored step, then the resumed job's."""
    killed: list[tuple[int, list[int]]] = []
    resumed: list[tuple[int, list[int]]] = []
    ended = False
    for line in log.read_text().splitlines():
        phase, rest = line.split(" ", 1)
        if rest == "end":
            ended = ended or phase == "resume"
            continue
        step, *ids = (int(v) for v in rest.split())
        (killed if phase == "kill" else resumed).append((step, ids))
    restored = resumed[0][0] - 1 if resumed else max((s for s, _ in killed), default=0)
    trained: Counter = Counter()
    for step, ids in killed:
        if step <= restored:
            trained.update(ids)
    for _, ids in resumed:
        trained.update(ids)
    return RestoreCounts(records=records, restored_step=restored, killed_steps=len(killed), trained=dict(trained),
                         resumed_ended=ended)


def kill_and_resume_job(directory: Path, job: str, args: tuple[str, ...] = (), records: int = 400) -> RestoreCounts:
    """kill_and_resume for another job module that takes --dir, --records and --phase and writes the same log
    (tests/tf2/restore_loop.py: a TF2 custom loop on a split step)."""
    directory.mkdir(parents=True, exist_ok=True)
    common = ["--dir", str(directory), "--records", str(records), *args]
    _run([*common, "--phase", "kill"], expect_kill=True, job=job)
    _run([*common, "--phase", "resume"], expect_kill=False, job=job)
    return count(directory / "steps.log", records)


def add_job_arguments(parser) -> None:
    """The arguments every job of this harness takes (restore_job.py, tests/tf2/restore_loop.py)."""
    parser.add_argument("--phase", choices=["kill", "resume"], required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--kill-at-step", type=int, default=30, help="kill after the first checkpoint from here")
    parser.add_argument("--kill-after", type=int, default=3, help="steps run after that checkpoint, then SIGKILL")


class StepLog:
    """A job's side of the harness: record() appends "<phase> <step> <ids...>" to <dir>/steps.log, flushed and
    fsynced before the next step, and in the kill phase SIGKILLs the job `kill_after` steps after the first
    checkpoint (a step that is a multiple of `save_steps`) from `kill_at_step`; close() writes "<phase> end"."""

    def __init__(self, args):
        import os

        self._args = args
        self._log = open(os.path.join(args.dir, "steps.log"), "a")
        self._killing_from = None

    def record(self, step: int, ids) -> None:
        import os

        args = self._args
        self._log.write(f"{args.phase} {step} {' '.join(str(i) for i in ids)}\n")
        self._log.flush()
        os.fsync(self._log.fileno())
        if args.phase != "kill":
            return
        if self._killing_from is None and step >= args.kill_at_step and step % args.save_steps == 0:
            self._killing_from = step  # this step's state was saved in this run
        if self._killing_from is not None and step >= self._killing_from + args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        self._log.write(f"{self._args.phase} end\n")
        self._log.close()
