"""input_tasks: the prefetch side of each stage on the tasks of an input job (scale-out, docs/scale-out.md).

    before:  reader@trainer -> decode@trainer -> hash@trainer -> put@trainer ~~ take@trainer
    after (central, 2 tasks):
             reader@trainer -> decode@input/task:0 -> hash@input/task:0 -> put@trainer ~~ take@trainer
                           \\-> stage/input_task_1/decode@input/task:1 -> stage/input_task_1/hash@input/task:1
    after (sharded, 2 tasks): every task has the whole side, its source sharded (shard(2, i)).

Central mode splits the prefetch side into its *head* (what must run once per batch, in order, on the
trainer: iterator/queue/reader reads, random ops, other stateful ops, table lookups, and everything
upstream of them) and its *body* (the stateless rest). The body goes to `/job:<job>/task:0`, and a copy
of it per further task goes to `<stage>/input_task_<i>/` on task i. The runtime (runtime/lanes/remote.py)
runs the head serially on the trainer and the body of batch n on task n mod N, in order.

Sharded mode copies the whole prefetch side per task (the iterator, its initializer and dataset chain
too) and inserts `ShardDataset(num_shards=N, index=i)` after each source dataset of task i's copy; the
runtime interleaves the tasks' batches round-robin. Running the original initializer initializes every
copy (a control edge from each copy's MakeIterator).

Buffer, put and take never move. A marker NoOp `<stage>/input_tasks` records the plan for the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.heads import INPUT_TASKS, close_head
from smartstage.graph.op_types import ITERATOR_READS, UNFEEDABLE_DTYPES, is_ref_dtype, is_stateful_op
from smartstage.graph.stage_names import (ATTR_CUT, ATTR_MODE, ATTR_TASKS, ATTR_THREADS_PER_TASK, ATTR_TIMEOUT,
                                          input_task_scope, input_tasks_marker)
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.gpu.devices import stage_task
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from smartstage.passes.manager import PassContext, PassResult
from smartstage.passes.stage_defs import replace_stage_def, with_fields
from smartstage.protos import AUTOTUNE

_ITERATOR_OPS = {"IteratorV2", "Iterator"}
_SOURCE_DATASETS = {"TensorSliceDataset", "TensorDataset", "TextLineDataset", "TFRecordDataset",
                    "FixedLengthRecordDatasetV2", "FixedLengthRecordDataset", "RangeDataset"}


@dataclass
class StageInputPlacement:
    """What the pass placed for one stage: where each part runs, and what it left and why."""

    stage: str
    mode: str
    trainer_task: str
    tasks: tuple[str, ...]
    head: tuple[str, ...] = ()        # stays on the trainer (central mode)
    body: tuple[str, ...] = ()        # originals placed on task 0
    copies: int = 0                   # nodes added for tasks 1..N-1
    cut: tuple[str, ...] = ()         # tensors the trainer hands to the tasks per batch (central)
    skipped: str = ""                 # why the stage was left as it was
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def task_devices(job: str, count: int) -> tuple[str, ...]:
    """`/job:input/replica:0/task:<i>/device:CPU:0` for every task of the input job."""
    return tuple(f"/job:{job}/replica:0/task:{i}/device:CPU:0" for i in range(count))


class InputTasks:
    """Places each stage's prefetch side on the input job's tasks (see the module docstring)."""

    name = "input_tasks"
    requires = ("stages",)
    provides = ()

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        options = ctx.options
        view = ctx.view_of(graph_def)
        tasks = task_devices(options.input_job, options.input_tasks)
        log = EditLog(view)
        sides = prefetch_sides(view, ctx.stages)
        summary, details = [], {}
        for stage in list(ctx.stages):  # a stage whose StageDef changes is replaced in ctx.stages
            trainer = stage_task([view.node(n).device for n in stage.ops if n in view]).to_string()
            plan = StageInputPlacement(stage.name, options.input_mode, trainer or "(the session's task)", tasks)
            details[stage.name] = plan
            if input_tasks_marker(stage.name) in view:
                plan.skipped = "already placed on input tasks (its marker node exists)"
            elif stage.kind != FIFO:
                plan.skipped = f"a {stage.kind} stage: only FIFO-queue stages run lanes"
            else:
                if options.input_mode == "central":
                    _central(log, view, stage, [n for n in sides.prefetch_only(stage.name) if n in view], plan)
                else:  # the whole side, the iterator (shared with its initializer) included
                    _sharded(log, view, stage, sorted(sides.side.get(stage.name, ())), plan)
            if plan.skipped:
                summary.append(f"{stage.name}: left on the trainer: {plan.skipped}")
                continue
            log.add_node(_marker(stage, view, plan, options))
            if stage.stage_def is not None:
                num_threads = len(tasks) * options.input_num_threads_per_task
                if stage.stage_def.num_threads != AUTOTUNE and stage.stage_def.num_threads < num_threads:
                    # one lane per task at least (AUTOTUNE is kept)
                    replace_stage_def(ctx, log, stage, with_fields(stage.stage_def, num_threads=num_threads))
            where = f"{tasks[0]}" + (f" .. task:{len(tasks) - 1}" if len(tasks) > 1 else "")
            if plan.mode == "central":
                summary.append(f"{stage.name}: {len(plan.body)} body node(s) on {where} ({plan.copies} copied for "
                               f"tasks 1..{len(tasks) - 1}); {len(plan.head)} head node(s) stay on the trainer; "
                               f"{len(plan.cut)} tensor(s) cross to the tasks per batch; buffer, put and take stay")
            else:
                summary.append(f"{stage.name}: sharded: {len(plan.body)} node(s) on {where}, each task reading "
                               f"shard i of {len(tasks)} ({plan.copies} node(s) copied); buffer, put and take stay")
            summary.extend(f"{stage.name}: {note}" for note in plan.notes)
        changed = any(not p.skipped for p in details.values())
        new = apply_to_graph_def(graph_def, log.edits, view) if changed else graph_def
        return PassResult(new, changed=changed, summary=tuple(summary), details=details,
                          edits=log.edits if changed else ())


def _head_of(view: GraphView, side: set[str]) -> set[str]:
    """The nodes of `side` that stay on the trainer (graph/heads.py's INPUT_TASKS rule: stateful ones but the
    order-free, readers of a resource or ref), those colocated with a node outside the body, and everything
    upstream of or tied to them."""
    head = set()
    for name in side:
        node = view.node(name)
        reads_state = any(view.dtype_of(t) == types_pb2.DT_RESOURCE or is_ref_dtype(view.dtype_of(t))
                          for t in view.data_inputs(name))
        colocated = any(c.startswith(b"loc:@") and c[5:].decode() not in side
                        for c in node.attr["_class"].list.s) if "_class" in node.attr else False
        if INPUT_TASKS.is_head_op(node.op, is_stateful_op(node.op), reads_state=reads_state) or colocated:
            head.add(name)
    return close_head(side, head, lambda nodes: set(view.ancestors(nodes)) | nodes, lambda name, grown: any(
        t.node in grown and (t.is_control or view.dtype_of(t) in UNFEEDABLE_DTYPES or view.dtype_of(t) is None)
        for t in view.inputs(name)))


def _set_device(log: EditLog, name: str, device: str) -> None:
    if log.device_of(name) != device:
        log.set_device(name, device)


def _central(log: EditLog, view: GraphView, stage: StageBoundary, side: list[str], plan: StageInputPlacement) -> None:
    side_set = set(side)
    head = _head_of(view, side_set)
    body = [n for n in side if n not in head]
    if not body:
        plan.skipped = "its prefetch side has no stateless body to place (everything runs once per batch, in order)"
        return
    body_set = set(body)
    cut = []
    for name in body + [stage.put]:
        for t in view.data_inputs(name):
            if t.node in head and str(t) not in cut:
                cut.append(str(t))
    plan.head, plan.body, plan.cut = tuple(sorted(head)), tuple(body), tuple(cut)
    for name in body:
        _set_device(log, name, plan.tasks[0])
    order = [n for n in view.order() if n in body_set]
    for task in range(1, len(plan.tasks)):
        copies = _copies(view, order, body_set, stage.name, task, plan.tasks[task])
        for copy in copies:
            log.add_node(copy)
        plan.copies += len(copies)


def _copies(view: GraphView, order: list[str], copied: set[str], stage: str, task: int,
            device: str) -> list[node_def_pb2.NodeDef]:
    """Task `task`'s copy of each node of `order`, under `<stage>/input_task_<task>/`, on `device`."""
    scope = input_task_scope(stage, task)
    copies = []
    for name in order:
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(view.node(name))
        copy.name = scope + name
        copy.device = device
        del copy.input[:]
        for raw in view.raw_inputs(name):
            t = parse_tensor_name(raw)
            copy.input.append(("^" if t.is_control else "") + scope + raw.lstrip("^") if t.node in copied else raw)
        if "_class" in copy.attr:  # colocation within the copy only (the head never colocates with the body)
            kept = [b"loc:@" + scope.encode() + c[5:] for c in copy.attr["_class"].list.s if c[5:].decode() in copied]
            if kept:
                copy.attr["_class"].list.s[:] = kept
            else:
                del copy.attr["_class"]
        if copy.op in _ITERATOR_OPS and copy.attr["shared_name"].s:
            copy.attr["shared_name"].s += f"_input_task_{task}".encode()
        copies.append(copy)
    return copies


def _sharded(log: EditLog, view: GraphView, stage: StageBoundary, side: list[str], plan: StageInputPlacement) -> None:
    iterators = [n for n in side if view.op(n) in _ITERATOR_OPS]
    reads = [n for n in side if view.op(n) in ITERATOR_READS]
    if len(iterators) != 1 or not reads:
        plan.skipped = ("sharded mode needs one initializable tf.data iterator on the prefetch side "
                        f"(found {len(iterators)} iterator(s)); use input_mode='central'")
        return
    makers = [c for c in view.consumers(iterators[0]) if view.op(c) == "MakeIterator"]
    if len(makers) != 1:
        plan.skipped = (f"iterator {iterators[0]!r} has {len(makers)} MakeIterator initializer(s), not one "
                        "(a one-shot iterator cannot be sharded); use input_mode='central'")
        return
    maker = makers[0]
    dataset = view.data_inputs(maker)[0].node
    chain = view.ancestors([dataset])
    sources = sorted(n for n in chain if view.op(n) in _SOURCE_DATASETS)
    if not sources:
        plan.skipped = f"no source dataset ({sorted(_SOURCE_DATASETS)}) found upstream of {maker!r} to shard"
        return
    nodes = set(side) | chain | {maker}
    order = [n for n in view.order() if n in nodes]
    plan.body, plan.head = tuple(order), ()
    for name in order:
        _set_device(log, name, plan.tasks[0])
    count = len(plan.tasks)
    added, shards = _shards(view, sources, 0, count, plan.tasks[0], "")
    for node in added:
        log.add_node(node)
    _reroute(log, shards, nodes)
    for task in range(1, count):
        scope = input_task_scope(stage.name, task)
        copies = _copies(view, order, nodes, stage.name, task, plan.tasks[task])
        added, shards = _shards(view, sources, task, count, plan.tasks[task], scope)
        for node in copies:
            node.input[:] = [_through_shard(raw, shards, scope) for raw in node.input]
        for node in copies + added:
            log.add_node(node)
        plan.copies += len(copies)
        log.set_inputs(maker, [*log.inputs_of(maker), f"^{scope}{maker}"])
    plan.notes.append(f"sources {sources} read shard i of {count} on task i; running {maker!r} initializes "
                      "every task's copy")


def _shards(view: GraphView, sources: list[str], task: int, count: int, device: str,
            scope: str) -> tuple[list[node_def_pb2.NodeDef], dict[str, str]]:
    """ShardDataset(source, count, task) after each source dataset of task `task`'s copy: the new nodes,
    and the shard of each source."""
    nodes, shards = [], {}
    for source in sources:
        base = f"{scope}{source}/input_shard"
        for suffix, value in (("num_shards", count), ("index", task)):
            const = node_def_pb2.NodeDef(name=f"{base}/{suffix}", op="Const", device=device)
            const.attr["dtype"].type = types_pb2.DT_INT64
            const.attr["value"].tensor.dtype = types_pb2.DT_INT64
            const.attr["value"].tensor.int64_val.append(value)
            nodes.append(const)
        shard = node_def_pb2.NodeDef(name=base, op="ShardDataset", device=device,
                                     input=[f"{scope}{source}", f"{base}/num_shards", f"{base}/index"])
        for key in ("output_types", "output_shapes"):
            shard.attr[key].CopyFrom(view.node(source).attr[key])
        shard.attr["require_non_empty"].b = False
        nodes.append(shard)
        shards[source] = base
    return nodes, shards


def _through_shard(raw: str, shards: dict[str, str], scope: str) -> str:
    t = parse_tensor_name(raw)
    for source, shard in shards.items():
        if not t.is_control and t.node == scope + source:
            return shard
    return raw


def _reroute(log: EditLog, shards: dict[str, str], nodes: set[str]) -> None:
    """Task 0's readers of each source read its shard instead."""
    for name in sorted(nodes):
        inputs = log.inputs_of(name)
        rerouted = [shards[parse_tensor_name(raw).node]
                    if not raw.startswith("^") and parse_tensor_name(raw).node in shards else raw for raw in inputs]
        if rerouted != list(inputs):
            log.set_inputs(name, rerouted)


def _marker(stage: StageBoundary, view: GraphView, plan: StageInputPlacement, options) -> node_def_pb2.NodeDef:
    """The NoOp `<stage>/input_tasks` whose attributes hold the plan the runtime reads."""
    marker = node_def_pb2.NodeDef(name=input_tasks_marker(stage.name), op="NoOp", device=view.node(stage.put).device)
    marker.attr[ATTR_TASKS].list.s.extend(t.encode() for t in plan.tasks)
    marker.attr[ATTR_MODE].s = plan.mode.encode()
    marker.attr[ATTR_CUT].list.s.extend(t.encode() for t in plan.cut)
    marker.attr[ATTR_TIMEOUT].i = options.input_timeout_millis
    marker.attr[ATTR_THREADS_PER_TASK].i = options.input_num_threads_per_task
    return marker


__all__ = ["InputTasks", "StageInputPlacement", "task_devices"]
