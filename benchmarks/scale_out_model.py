"""A model of scale-out with input tasks: what per-batch CPU, boundary bytes and task count predict.

    model = ClusterModel.fit(c_in=0.012, local_cpu=0.014, task_cpu=0.003, boundary_bytes=1024)
    model.local_rate(trainer_cores=1)                            # everything on the trainer
    model.tasks_rate(trainer_cores=8, tasks=16, cores_per_task=4)  # the prefetch side on 16 input tasks

Terms (CPU seconds per batch, measured by benchmarks/scale_out_cpu.py):
    c_in     the prefetch side alone (read + preprocessing)
    c_step   the trainer's own work per step: local_cpu - c_in (local_cpu: the trainer's CPU per step with
             everything on it)
    c_rpc    what a batch from an input task costs the trainer beyond c_step (gRPC receive, the lane's
             queues): task_cpu - c_step (task_cpu: the trainer's CPU per step with one input task)

Predicted steps/s:
    local:  trainer_cores / (c_in + c_step)                                         (lanes share the cores)
    tasks:  min(trainer_cores / (c_step + c_rpc),                                   (the trainer's cores)
                tasks * min(cores_per_task, lanes_per_task) / (c_in + c_rpc),       (the tasks' cores; the send
                                                                                     assumed to cost the task
                                                                                     what the receive costs
                                                                                     the trainer)
                bandwidth / boundary_bytes)                                          (the trainer's network)
It ignores what no run here measured: latency between hosts (hidden by the lanes' buffering while it is
under a step), a trainer NIC shared with parameter servers, and preprocessing that does not split into
independent batches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DEFAULT_BANDWIDTH = 1.25e9  # bytes/s: a 10 Gb/s network, the trainer's side


@dataclass(frozen=True)
class ClusterModel:
    c_in: float
    c_step: float
    c_rpc: float
    boundary_bytes: int
    bandwidth: float = DEFAULT_BANDWIDTH

    @classmethod
    def fit(cls, c_in: float, local_cpu: float, task_cpu: float, boundary_bytes: int,
            bandwidth: float = DEFAULT_BANDWIDTH) -> "ClusterModel":
        """The model's terms from three measurements (see the module docstring).

            ClusterModel.fit(0.012, 0.014, 0.003, 1024)   # before: CPU per batch / per step, measured
                                                          # after:  c_in 12 ms, c_step 2 ms, c_rpc 1 ms
        """
        c_step = max(local_cpu - c_in, 0.0)
        return cls(c_in, c_step, max(task_cpu - c_step, 0.0), boundary_bytes, bandwidth)

    def local_rate(self, trainer_cores: float) -> float:
        return trainer_cores / (self.c_in + self.c_step)

    def tasks_rate(self, trainer_cores: float, tasks: int, cores_per_task: float, lanes_per_task: int = 1) -> float:
        trainer = trainer_cores / max(self.c_step + self.c_rpc, 1e-9)
        inputs = tasks * min(cores_per_task, lanes_per_task) / (self.c_in + self.c_rpc)
        return min(trainer, inputs, self.bandwidth / self.boundary_bytes)

    def tasks_needed(self, trainer_cores: float, cores_per_task: float, lanes_per_task: int = 1) -> int:
        """The fewest tasks at which the trainer's cores, not the input, set the pace."""
        per_task = min(cores_per_task, lanes_per_task) / (self.c_in + self.c_rpc)
        trainer = min(trainer_cores / max(self.c_step + self.c_rpc, 1e-9), self.bandwidth / self.boundary_bytes)
        return max(1, -(-int(trainer * 1000) // max(int(per_task * 1000), 1)))

    def as_dict(self) -> dict:
        return asdict(self)


def model_text(model: ClusterModel, trainer_cores: int = 8, cores_per_task: int = 4) -> str:
    """The fitted terms and a table of predictions for a larger cluster (Markdown)."""
    ms = lambda seconds: f"{1000 * seconds:.2f} ms"  # noqa: E731
    lanes = cores_per_task  # one lane per core of a task
    rows = [f"| {n} | {model.tasks_rate(trainer_cores, n, cores_per_task, lanes):.0f} |" for n in (1, 2, 4, 8, 16)]
    return "\n".join([
        f"Model (benchmarks/scale_out_model.py), fitted on this run: c_in {ms(model.c_in)} of CPU a batch on the "
        f"prefetch side, c_step {ms(model.c_step)} on the trainer per step, c_rpc {ms(model.c_rpc)} per batch "
        f"received from a task, {model.boundary_bytes} boundary bytes a batch. Predicted for a trainer of "
        f"{trainer_cores} cores: everything local {model.local_rate(trainer_cores):.0f} steps/s; with input tasks "
        f"of {cores_per_task} cores ({lanes} lanes each):", "",
        "| input tasks | steps/s |", "|---|---|", *rows, "",
        f"The trainer's cores bind from about {model.tasks_needed(trainer_cores, cores_per_task, lanes)} tasks on "
        f"(at {min(trainer_cores / max(model.c_step + model.c_rpc, 1e-9), 1e12):.0f} steps/s); the boundary's "
        f"bytes would bind at {model.bandwidth / model.boundary_bytes:.0f} steps/s on a 10 Gb/s link."])
