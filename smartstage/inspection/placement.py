"""Placement: which input task runs what, read from a graph optimized with `input_job` (docs/scale-out.md).

    before:  reader -> hash -> put ~~ take -> loss                      (every node on the trainer)
    after:   reader@trainer -> hash@input/task:0 -> put@trainer ~~ take@trainer
             stage/input_task_1/hash@input/task:1
    stage_placements(after) == (StagePlacement(stage="stage", mode="central",
        tasks=(TaskPlacement(task="/job:input/replica:0/task:0", nodes=1, ops=(("StringToHashBucketFast", 1),),
                             lanes=(0,)), TaskPlacement(task=".../task:1", nodes=1, ..., lanes=(1,))),
        head=("reader",), to_tasks=(reader:0 ...), from_tasks=(hash:0 ...)),)

Read from the graph alone: the marker NoOp `<stage>/input_tasks` the input_tasks pass leaves (its attributes
hold the tasks, the mode, the cut and the threads per task), the devices of the nodes and the copies under
`<stage>/input_task_<i>/`. Analysis only: nothing here edits a graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from tensorflow.core.framework import types_pb2

from smartstage.config.renamed import renamed_fields
from smartstage.graph.load import load_graph, stage_defs_of
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.stage_names import (ATTR_CUT, ATTR_MODE, ATTR_TASKS, ATTR_THREADS_PER_TASK, ATTR_TIMEOUT,
                                          INPUT_TASK_SCOPE as COPY_SCOPE, INPUT_TASKS_MARKER as MARKER)
from smartstage.graph.view import GraphView
from smartstage.inspection.sides import graph_sides, prefetch_side

EXAMPLES = 4     # example node names shown per task
TOP_OPS = 6      # op types shown per task, most frequent first
_QUIET_OPS = ("Const", "NoOp")  # never the interesting ops of a task: listed last


@dataclass(frozen=True)
class CrossingTensor:
    """A tensor that crosses the network once per batch; bytes None when its size is not fixed in the graph."""

    name: str
    dtype: str
    shape: str | None
    bytes: int | None


@dataclass(frozen=True)
class TaskPlacement:
    """What one input task runs for one stage."""

    task: str                          # /job:input/replica:0/task:1
    nodes: int
    ops: tuple[tuple[str, int], ...]   # the most frequent op types (constants last), with counts
    op_types: int                      # how many op types it runs in all
    examples: tuple[str, ...]          # a few of its node names, in graph order
    lanes: tuple[int, ...]             # central: the lanes whose body runs here (lane k: batches k, k+L, ...)


@renamed_fields({"lanes_per_task": "num_threads_per_task"})
@dataclass(frozen=True)
class StagePlacement:
    """One stage placed on input tasks: the tasks, what stays on the trainer, what crosses per batch.

    num_threads_per_task: central mode's prefetch threads per task (input_num_threads_per_task), one lane each.
    """

    stage: str
    mode: str                          # "central" or "sharded"
    job: str
    trainer: str                       # the device of the put ("" : the session's own task)
    num_threads_per_task: int
    timeout_millis: int
    tasks: tuple[TaskPlacement, ...]
    head: tuple[str, ...]              # prefetch-side nodes that stay on the trainer (central: the head)
    stage_ops: tuple[str, ...]         # buffer, put, take: always on the trainer
    to_tasks: tuple[CrossingTensor, ...]    # central: the cut, trainer -> a task, per batch
    from_tasks: tuple[CrossingTensor, ...]  # the put's inputs computed on a task: a task -> trainer, per batch

    def task_of(self, name: str) -> str | None:
        """The task that runs node `name` of this stage (an original or a copy), or None."""
        for i, task in enumerate(self.tasks):
            if name.startswith(f"{self.stage}/{COPY_SCOPE.format(i)}/"):
                return task.task
        return None

    @staticmethod
    def bytes_of(tensors: tuple[CrossingTensor, ...]) -> int | None:
        """Their bytes in all; None when one has no fixed size (a string, an unknown dimension)."""
        sizes = [t.bytes for t in tensors]
        return None if None in sizes else sum(sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "mode": self.mode, "job": self.job, "trainer": self.trainer,
                "num_threads_per_task": self.num_threads_per_task, "timeout_millis": self.timeout_millis,
                "lanes_per_task": self.num_threads_per_task,  # schema version 1's first spelling, kept for readers
                "tasks": [{"task": t.task, "nodes": t.nodes, "ops": [list(o) for o in t.ops], "op_types": t.op_types,
                           "examples": list(t.examples), "lanes": list(t.lanes)} for t in self.tasks],
                "head": list(self.head), "stage_ops": list(self.stage_ops),
                "to_tasks": [t.__dict__.copy() for t in self.to_tasks],
                "from_tasks": [t.__dict__.copy() for t in self.from_tasks],
                "to_tasks_bytes": self.bytes_of(self.to_tasks), "from_tasks_bytes": self.bytes_of(self.from_tasks)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StagePlacement":
        tasks = tuple(TaskPlacement(t["task"], t["nodes"], tuple(tuple(o) for o in t["ops"]), t["op_types"],
                                    tuple(t["examples"]), tuple(t["lanes"])) for t in d["tasks"])
        num_threads = d["num_threads_per_task"] if "num_threads_per_task" in d else d["lanes_per_task"]
        return cls(d["stage"], d["mode"], d["job"], d["trainer"], num_threads, d["timeout_millis"], tasks,
                   tuple(d["head"]), tuple(d["stage_ops"]), tuple(CrossingTensor(**t) for t in d["to_tasks"]),
                   tuple(CrossingTensor(**t) for t in d["from_tasks"]))


def stage_placements(graph, view: GraphView | None = None, sides=None) -> tuple[StagePlacement, ...]:
    """The placement of every stage of `graph` (any form load_graph takes) that has an input_tasks marker.

        before:  stage_placements(unoptimized) == ()
        after:   stage_placements(optimize(g, input_job="input", input_tasks=2).graph_def)[0].tasks[1].task
                 == "/job:input/replica:0/task:1"
    """
    if view is None:
        loaded = load_graph(graph)
        view = GraphView(loaded.graph_def)
        defs = stage_defs_of(loaded.meta_graph_def)
    else:
        defs = []
    markers = [n for n in view.names() if n.endswith("/" + MARKER) and view.op(n) == "NoOp"
               and ATTR_TASKS in view.node(n).attr]
    if not markers:
        return ()
    sides = sides if sides is not None else graph_sides(view, defs)
    stages = {s.name: s for s in sides.stages}
    placed = [(stages[m[:-len(MARKER) - 1]], view.node(m)) for m in markers if m[:-len(MARKER) - 1] in stages]
    owner = _owners(view, sides, placed)
    return tuple(_stage_placement(view, sides, stage, marker, owner) for stage, marker in placed)


def _owners(view: GraphView, sides, placed) -> dict[str, str]:
    """The stage each node on an input task belongs to: its copy's scope, else the stage that copied it or
    whose prefetch side holds it, else (a sharded stage's dataset chain, one task) the first stage on its task."""
    owner: dict[str, str] = {}
    devices = {stage.name: {s.decode() for s in marker.attr[ATTR_TASKS].list.s} for stage, marker in placed}
    for name in view.order():
        device = view.node(name).device
        on = [stage.name for stage, _ in placed if device in devices[stage.name]]
        if not on:
            continue
        scoped = [s for s in on if name.startswith(f"{s}/{COPY_SCOPE.format('')}")]
        copied = [s for s in on if f"{s}/{COPY_SCOPE.format(1)}/{name}" in view]
        sided = [s for s in on if sides.side.get(name) == prefetch_side(s)]
        owner[name] = (scoped or copied or sided or on)[0]
    return owner


def _stage_placement(view: GraphView, sides, stage, marker, owner: dict[str, str]) -> StagePlacement:
    attrs = marker.attr
    devices = [s.decode() for s in attrs[ATTR_TASKS].list.s]
    mode = attrs[ATTR_MODE].s.decode()
    per_task = max(1, int(attrs[ATTR_THREADS_PER_TASK].i))
    lanes = len(devices) * per_task
    side = set(sides.prefetch_nodes(stage.name))
    on_task: list[list[str]] = [[] for _ in devices]
    for name in view.order():
        if owner.get(name) == stage.name and view.node(name).device in devices:
            on_task[devices.index(view.node(name).device)].append(name)
    tasks = tuple(TaskPlacement(_task_name(device), len(names), _top_ops(view, names),
                                len({view.op(n) for n in names}), _examples(view, names),
                                tuple(k for k in range(lanes) if k % len(devices) == i) if mode == "central" else ())
                  for i, (device, names) in enumerate(zip(devices, on_task)))
    head = tuple(n for n in view.order() if n in side and view.node(n).device not in devices)
    placed = {n for names in on_task for n in names}
    cut = [s.decode() for s in attrs[ATTR_CUT].list.s]
    from_tasks = [t for t in view.data_inputs(stage.put) if t.node in placed]
    return StagePlacement(
        stage=stage.name, mode=mode, job=_job(devices[0]) if devices else "", trainer=view.node(stage.put).device,
        num_threads_per_task=per_task, timeout_millis=int(attrs[ATTR_TIMEOUT].i), tasks=tasks, head=head,
        stage_ops=tuple(n for n in (stage.buffer, stage.put, stage.take) if n),
        to_tasks=tuple(_crossing(view, parse_tensor_name(t)) for t in cut if parse_tensor_name(t).node in view),
        from_tasks=tuple(_crossing(view, t) for t in from_tasks))


def _examples(view: GraphView, names: list[str]) -> tuple[str, ...]:
    """A few node names, the computing ones first (a task's constants say little about what it runs)."""
    computing = [n for n in names if view.op(n) not in _QUIET_OPS]
    return tuple((computing + [n for n in names if n not in computing])[:EXAMPLES])


def _task_name(device: str) -> str:
    return device.rsplit("/device:", 1)[0]


def _job(device: str) -> str:
    return device.split("/job:", 1)[1].split("/", 1)[0] if "/job:" in device else ""


def _top_ops(view: GraphView, names: list[str]) -> tuple[tuple[str, int], ...]:
    counts = Counter(view.op(n) for n in names)
    ordered = sorted(counts.items(), key=lambda kv: (kv[0] in _QUIET_OPS, -kv[1], kv[0]))
    return tuple(ordered[:TOP_OPS])


def _crossing(view: GraphView, tensor) -> CrossingTensor:
    dtype = view.dtype_of(tensor)
    name = types_pb2.DataType.Name(dtype)[3:].lower() if dtype is not None and dtype in types_pb2.DataType.values() \
        else "unknown"
    shape = view.output_shape(tensor)
    dims = None if shape is None or shape.unknown_rank else [d.size for d in shape.dim]
    text = None if dims is None else "[" + ",".join("?" if d < 0 else str(d) for d in dims) + "]"
    size = _dtype_size(dtype)
    count = None if dims is None or any(d < 0 for d in dims) else _product(dims)
    return CrossingTensor(str(tensor), name, text, None if size is None or count is None else size * count)


def _dtype_size(dtype: int | None) -> int | None:
    """Bytes of one element; None for strings, resources and variants (no fixed size)."""
    if dtype is None or dtype in (types_pb2.DT_STRING, types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT):
        return None
    import tensorflow as tf  # the size table of every dtype

    try:
        return tf.dtypes.as_dtype(dtype).size
    except TypeError:
        return None


def _product(dims: list[int]) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def placement_of_node(placements: tuple[StagePlacement, ...], view: GraphView, name: str) -> str | None:
    """A sentence saying where `name` runs when a stage is placed on input tasks; None when none is.

        before:  placement_of_node((), view, "hash") is None
        after:   "'hash' runs on /job:input/replica:0/task:0 (lanes 0) for stage 'stage'; its copies ..."
    """
    for p in placements:
        if name in p.stage_ops:
            return f"{name!r} stays on the trainer: it is the {_role(p, name)} of stage {p.stage!r} (never moved)"
        if name in p.head:
            why = ("the head of the central source runs once per batch, in order, on the trainer"
                   if p.mode == "central" else "it is not part of the sharded input")
            return f"{name!r} stays on the trainer for stage {p.stage!r}: {why}"
        task = p.task_of(name)
        device = view.node(name).device if name in view else ""
        if task is None and device and any(device.startswith(t.task + "/") for t in p.tasks):
            task = _task_name(device)
        if task is None:
            continue
        index = [t.task for t in p.tasks].index(task)
        lanes = _lanes_text(p, p.tasks[index])
        found = [(i, f"{p.stage}/{COPY_SCOPE.format(i)}/{name}") for i in range(1, len(p.tasks))]
        found = [(i, c) for i, c in found if c in view]
        copies = [c for _, c in found]
        numbers = ", ".join(str(i) for i, _ in found)
        also = (f"; its cop{'ies' if len(copies) > 1 else 'y'} on task{'s' if len(copies) > 1 else ''} {numbers}: "
                f"{', '.join(copies[:3])}{', ...' if len(copies) > 3 else ''}" if copies else "")
        return f"{name!r} runs on {task} ({lanes}) for stage {p.stage!r}{also}"
    return None


def _role(p: StagePlacement, name: str) -> str:
    return ("buffer", "put", "take")[p.stage_ops.index(name)] if len(p.stage_ops) == 3 else "stage op"


def _lanes_text(p: StagePlacement, task: TaskPlacement) -> str:
    if p.mode == "sharded":
        index = [t.task for t in p.tasks].index(task.task)
        return f"shard {index} of {len(p.tasks)}"
    return "lane" + ("s " if len(task.lanes) != 1 else " ") + ", ".join(str(k) for k in task.lanes)


def placement_lines(placements: tuple[StagePlacement, ...]) -> list[str]:
    """The placement as text lines: one block per stage (what `explain --placement` and `diff` print).

        stage 'stage': central source on 2 task(s) of job 'input', 1 lane per task
          trainer (the session's task): head 1 node(s): IteratorGetNext; buffer, put, take: stage/buffer, ...
          /job:input/replica:0/task:0 (lane 0): 19 node(s): Reshape x2, ...; e.g. Abs, add, Sqrt, Log1p
    """
    lines: list[str] = []
    for p in placements:
        kind = "central source" if p.mode == "central" else "sharded sources"
        lanes = (f", {p.num_threads_per_task} thread(s) per task, batch n's body on task n mod {len(p.tasks)}"
                 if p.mode == "central" else ", one reader per task, batches taken from the tasks in turn")
        lines.append(f"stage {p.stage!r}: {kind} on {len(p.tasks)} task(s) of job {p.job!r}{lanes}")
        trainer = p.trainer or "(the session's task)"
        head = (f"head {len(p.head)} node(s): {_names(p.head)}" if p.head else "no head")
        lines.append(f"  trainer {trainer}: {head}; buffer, put, take: {', '.join(p.stage_ops)}")
        for t in p.tasks:
            ops = ", ".join(f"{op} x{n}" for op, n in t.ops) + (f", ... (+{t.op_types - len(t.ops)} op types)"
                                                                 if t.op_types > len(t.ops) else "")
            lines.append(f"  {t.task} ({_lanes_text(p, t)}): {t.nodes} node(s): {ops}; e.g. {', '.join(t.examples)}")
        for title, tensors in (("trainer -> tasks", p.to_tasks), ("tasks -> trainer", p.from_tasks)):
            if not tensors:
                lines.append(f"  per batch {title}: nothing")
                continue
            known = [t.bytes for t in tensors if t.bytes is not None]
            unknown = len(tensors) - len(known)
            size = (f"{sum(known)} bytes" if not unknown else f"{sum(known)} bytes + {unknown} of unknown size"
                    if known else "size unknown") + (" (strings or unknown dimensions)" if unknown else "")
            shown = ", ".join(f"{t.name} {t.dtype}{t.shape or '[?]'}" for t in tensors)
            lines.append(f"  per batch {title}: {len(tensors)} tensor(s), {size}: {shown}")
    return lines


def _names(names: tuple[str, ...], limit: int = EXAMPLES) -> str:
    return ", ".join(names[:limit]) + (f", ... (+{len(names) - limit})" if len(names) > limit else "")


__all__ = ["CrossingTensor", "StagePlacement", "TaskPlacement", "placement_lines", "placement_of_node",
           "stage_placements"]
