"""A model of scale-out with input tasks: what per-batch CPU, boundary bytes and task count predict.

    model = ClusterModel(c_in=0.010, local_cpu=0.028, trainer_cpu=0.011, task_cpu=0.012, lane_seconds=0.023,
                         boundary_bytes=1024)
    model.local_rate(trainer_cores=1)                             # everything on the trainer
    model.tasks_rate(trainer_cores=8, tasks=16, cores_per_task=4)   # the prefetch side on 16 input tasks

Terms, CPU seconds per batch, each measured in the run (benchmarks/scale_out_cpu.py), none derived:
    local_cpu     the trainer process's, with everything on it (AUTOTUNE's local lanes)
    trainer_cpu   the trainer process's, with the prefetch side on input tasks (its step, gRPC, the lanes)
    task_cpu      the input-task processes', per batch they produce (the body, gRPC)
    c_in          the prefetch side alone in one process (read + preprocessing): task_cpu - c_in is what
                  serving a batch over gRPC costs a task
    lane_seconds  wall seconds a lane takes per batch (1 / steps/s with one input task, one lane): the
                  trainer's head run, the round trip and the task's body, one batch at a time

Predicted steps/s:
    local:  trainer_cores / local_cpu
    tasks:  min(trainer_cores / trainer_cpu,                (the trainer's cores)
                tasks * lanes_per_task / lane_seconds,      (the lanes: one batch at a time each)
                tasks * cores_per_task / task_cpu,          (the tasks' cores)
                bandwidth / boundary_bytes)                 (the trainer's network)
The CPU terms predict the rate where the cores are the job's own: on a loaded machine the measured rates
fall below it in proportion. It ignores what no run here measured: latency between hosts, a trainer NIC shared
with parameter servers, preprocessing that does not split into independent batches.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_BANDWIDTH = 1.25e9  # bytes/s: a 10 Gb/s network, the trainer's side


def _rate(capacity: float, cost: float) -> float:
    """capacity / cost per batch; no bound (inf) when the cost measured 0 (a run shorter than the clock's tick)."""
    return capacity / cost if cost > 0 else math.inf


@dataclass(frozen=True)
class ClusterModel:
    c_in: float
    local_cpu: float
    trainer_cpu: float
    task_cpu: float
    lane_seconds: float
    boundary_bytes: int
    bandwidth: float = DEFAULT_BANDWIDTH

    def local_rate(self, trainer_cores: float) -> float:
        """Everything on the trainer: its cores over its CPU per step.

            ClusterModel(0.010, 0.028, 0.011, 0.012, 0.023, 1024).local_rate(1)  # before: 28 ms of CPU a step
                                                                          # after:  35.7 steps/s on one core
        """
        return _rate(trainer_cores, self.local_cpu)

    def tasks_rate(self, trainer_cores: float, tasks: int, cores_per_task: float, lanes_per_task: int = 1) -> float:
        """The prefetch side on `tasks` input tasks: the lowest of the trainer's, the lanes', the tasks' cores' and
        the network's rate (cores_per_task may be a fraction: tasks sharing cores)."""
        trainer = _rate(trainer_cores, self.trainer_cpu)
        lanes = _rate(tasks * lanes_per_task, self.lane_seconds)
        cores = _rate(tasks * cores_per_task, self.task_cpu)
        return min(trainer, lanes, cores, _rate(self.bandwidth, self.boundary_bytes))

    def tasks_needed(self, trainer_cores: float, cores_per_task: float, lanes_per_task: int = 1) -> int:
        """The fewest tasks at which the trainer (its cores or its network), not the input, sets the pace."""
        per_task = min(_rate(lanes_per_task, self.lane_seconds), _rate(cores_per_task, self.task_cpu))
        trainer = min(_rate(trainer_cores, self.trainer_cpu), _rate(self.bandwidth, self.boundary_bytes))
        if math.isinf(trainer) or math.isinf(per_task):
            return 1
        return max(1, math.ceil(trainer / per_task - 1e-9))

    def as_dict(self) -> dict:
        return asdict(self)


def model_text(model: ClusterModel, trainer_cores: int = 8, cores_per_task: int = 4) -> str:
    """The measured terms and a table of predictions for a larger cluster (Markdown)."""
    ms = lambda seconds: f"{1000 * seconds:.1f} ms"  # noqa: E731
    lanes = cores_per_task  # one lane per core of a task
    rows = [f"| {n} | {model.tasks_rate(trainer_cores, n, cores_per_task, lanes):.0f} |" for n in (1, 2, 4, 8, 16)]
    serving = (f"{ms(model.task_cpu - model.c_in)} of it serving the batch over gRPC" if model.task_cpu > model.c_in
               else "no more than the prefetch side alone: serving a batch over gRPC is within the noise")
    return "\n".join([
        f"Model (benchmarks/scale_out_model.py), its terms measured in this run (CPU a batch): the prefetch side "
        f"alone {ms(model.c_in)}; the trainer with everything local {ms(model.local_cpu)}, with input tasks "
        f"{ms(model.trainer_cpu)}; the input tasks {ms(model.task_cpu)} ({serving}); a lane {ms(model.lane_seconds)} a batch, wall; {model.boundary_bytes} "
        f"boundary bytes a batch. Predicted for a trainer of "
        f"{trainer_cores} cores: everything local {model.local_rate(trainer_cores):.0f} steps/s; with input tasks "
        f"of {cores_per_task} cores ({lanes} lanes each):", "",
        "| input tasks | steps/s |", "|---|---|", *rows, "",
        f"The trainer's cores bind from {model.tasks_needed(trainer_cores, cores_per_task, lanes)} tasks on (at "
        f"{_rate(trainer_cores, model.trainer_cpu):.0f} steps/s); the boundary's bytes would bind at "
        f"{_rate(model.bandwidth, model.boundary_bytes):.0f} steps/s on a 10 Gb/s link."])
