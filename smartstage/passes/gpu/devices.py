"""Device strings: parse, compare and rewrite them the way stock TensorFlow reads them.

    parse_device("/gpu:0") == parse_device("/device:GPU:0")                      # True
    cpu_device_for("/job:worker/replica:0/task:1/device:GPU:0", DeviceSpec())  # ".../task:1/device:CPU:0"
    stage_task([put.device, take.device], [reader.device for reader in readers])  # the task of a stage

Pure functions of strings (cached); nothing here reads a graph.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Iterable

from tensorflow.python.framework import device_spec

DeviceSpec = device_spec.DeviceSpecV2

CPU = "CPU"
GPU = "GPU"


@functools.lru_cache(maxsize=4096)
def parse_device(device: str) -> DeviceSpec:
    """The DeviceSpec of a device string ("" gives an empty spec); "/gpu:0" and "/device:GPU:0" agree."""
    return DeviceSpec.from_string(device or "")


def device_type(device: str) -> str | None:
    """"GPU", "CPU", ... of a device string, upper-cased; None when the string names no device type."""
    kind = parse_device(device).device_type
    return kind.upper() if kind else None


def is_gpu(device: str) -> bool:
    return device_type(device) == GPU


def task_spec(device: str) -> DeviceSpec:
    """Only the job, replica and task of a device string."""
    spec = parse_device(device)
    return DeviceSpec(job=spec.job, replica=spec.replica, task=spec.task)


def has_task(spec: DeviceSpec) -> bool:
    return spec.job is not None or spec.replica is not None or spec.task is not None


def stage_task(*candidates: Iterable[str]) -> DeviceSpec:
    """The task of a stage, from groups of device strings in order of authority (say: its own ops, then
    its readers): the first group naming a task decides. Within it the tasks named are merged when they
    agree ("/job:worker/task:1" and "/job:worker/replica:0/task:1" give the latter), else the most common
    wins (ties: the smallest); so the answer never depends on the order of the strings."""
    for devices in candidates:
        tasks = [task_spec(d) for d in devices]
        tasks = [t for t in tasks if has_task(t)]
        if not tasks:
            continue
        merged = tasks[0]
        for t in tasks[1:]:
            merged = merge_compatible(merged, t)
            if merged is None:
                break
        if merged is not None:
            return merged
        best = most_common(t.to_string() for t in tasks)
        return parse_device(best)
    return DeviceSpec()


def merge_compatible(a: DeviceSpec, b: DeviceSpec) -> DeviceSpec | None:
    """The union of two device specs' fields, or None when a field is set differently in each."""
    fields = ("job", "replica", "task", "device_type", "device_index")
    for f in fields:
        va, vb = getattr(a, f), getattr(b, f)
        if va is not None and vb is not None and (va.upper() if isinstance(va, str) and f == "device_type" else va) \
                != (vb.upper() if isinstance(vb, str) and f == "device_type" else vb):
            return None
    return a.make_merged_spec(b)


@functools.lru_cache(maxsize=4096)
def cpu_device_for(device: str, default_task: DeviceSpec) -> str:
    """The CPU of the task `device` is on: job, replica and task kept, the device made CPU.

    A device that names no job, replica or task gets `default_task` (the stage's task); a device
    already on a CPU keeps its CPU index.

    >>> cpu_device_for("/job:worker/replica:0/task:1/device:GPU:0", DeviceSpec())
    '/job:worker/replica:0/task:1/device:CPU:0'
    >>> cpu_device_for("", DeviceSpec())
    '/device:CPU:0'
    """
    spec = parse_device(device)
    task = DeviceSpec(job=spec.job, replica=spec.replica, task=spec.task) if has_task(spec) else default_task
    index = spec.device_index if device_type(device) == CPU and spec.device_index is not None else 0
    return task.replace(device_type=CPU, device_index=index).to_string()


@functools.lru_cache(maxsize=4096)
def same_device(a: str, b: str) -> bool:
    """Whether two device strings name the same device ("/gpu:0" == "/device:GPU:0")."""
    return parse_device(a) == parse_device(b)


def covers(wanted: str, device: str) -> bool:
    """Whether `device` (maybe partial) is consistent with the full `wanted` device: no field contradicts it."""
    if not device:
        return False
    return parse_device(wanted).make_merged_spec(parse_device(device)) == parse_device(wanted)


def most_common(devices: Iterable[str]) -> str | None:
    """The most frequent device string (the smallest string wins a tie, whatever the order), or None."""
    counts = Counter(devices)
    if not counts:
        return None
    return min(counts, key=lambda d: (-counts[d], d))


__all__ = [
    "CPU", "DeviceSpec", "GPU", "covers", "cpu_device_for", "device_type", "has_task", "is_gpu", "merge_compatible",
    "most_common", "parse_device", "same_device", "stage_task", "task_spec",
]
