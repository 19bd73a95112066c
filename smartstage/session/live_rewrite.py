"""Applying an optimize() result to the user's live tf.Graph, in place, before the first step.

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss          (the graph the user built)
    after:   reader -> hash -> put' ~~ take' -> lookup(w) -> loss        (the same tf.Graph object)

A session cannot run a rewritten GraphDef copy: the user holds Python handles (train_op, tensors,
savers, hooks, Scaffold, queue runners, iterators) into the graph they built, and importing a copy
loses them. So the session exports the live graph, runs optimize() on the export, and replays the
partition's edits (the same edits as smartstage.rewrite.rebuild_boundary) on the live graph:

- A live op's outputs cannot change, so each changed stage gets a NEW buffer, put, take, close,
  cancel and size (`<stage>/smart_stage/...`, on the devices of the old ones) carrying the new
  boundary dtypes. The old ops stay in the graph, unused; the stage's StageDef (collection
  "smartstage_stages") and any QueueRunner of the stage now name the new ops, so the prefetch
  threads run the new put and nothing runs the old one. The old put is retired onto a queue of
  its own (`retired_buffer`), so an exported copy shows no second stage.
- Moved ops read the put's old inputs (Operation._update_input); main-side consumers read the new
  take; control edges that cross the cut are re-routed through the new put and take.
- Device changes of later passes (gpu placement, input tasks) are copied onto the live ops; what the
  input-tasks pass added (per-task copies, shards, the marker) is replayed by session/live_input_tasks.py.
- Nothing is removed or renamed: variables, savers and checkpoints are untouched.

The rewrite happens once per graph (`live_rewrite_of(graph)` returns the record) and only before any
session has run the graph: TensorFlow ignores edits of nodes a session has already run.
The record also maps what moved: `tensor_map` (a moved or old take tensor -> the new take output
that carries it, for fetches) and `prefetch_nodes` (node -> its stage, for clear errors).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import tensorflow as tf
from tensorflow.python.ops import gen_data_flow_ops

from smartstage.config.options import SmartStageOptions
from smartstage.errors import ConfigError, GraphError, TargetError
from smartstage.graph.stages import FIFO
from smartstage.runtime.lanes.lanes import LANE_SCOPES
from smartstage.runtime.stage.metadata import STAGES_COLLECTION, StageRecord, stage_defs
from smartstage.session.live_input_tasks import apply_input_tasks
from smartstage.session.record import LiveRewrite, LiveStage, _dedupe, _set_control_inputs, rewrite_once

logger = logging.getLogger(__name__)

NEW_SCOPE = "smart_stage"
_ROLES = ("buffer", "put", "take", "close", "cancel", "size")
_STAGE_DEF_FIELDS = {"buffer": "buffer_node", "put": "put_node", "take": "take_node", "close": "close_node",
                     "cancel": "cancel_node", "size": "size_node"}



def _node_names(items: Iterable[Any]) -> list[str]:
    names = []
    for item in items or ():
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, (tf.Tensor, tf.Operation)) or hasattr(item, "op"):
            names.append(item.name)
        else:
            raise TargetError(f"a target must be a tensor, an operation or a node name, not {item!r}")
    return names


def rewrite_live_graph(graph: tf.Graph, options: SmartStageOptions, targets: Iterable[Any] = ()) -> LiveRewrite:
    """Optimizes `graph` with `options` (the session parsed its config once) and applies the result to it in place (once per graph).

        before:  sess.run(train_op)   # the step parses every batch itself, behind the stage's take
        after:   rewrite_live_graph(graph, options); the same train_op now reads parsed features from the take

    targets: tensors, ops or node names the step fetches, kept on the main side (besides the marked
    targets and the train_op / losses / summaries / update_ops collections). What staged() returned stays
    fetchable without marking: the take of every staged() stage is a target, so its outputs keep
    crossing the rebuilt buffer and a later `sess.run(x)` gets the batch the step trains on (a buffer
    holds tensors by reference, so the extra components cost no copy).
    Raises NoStageError when the graph has no stage, TargetError when a target names no node.
    """
    import time

    from smartstage.optimizer import optimize

    if options.input_mode == "tfdata_service":
        # The pass replaces the dataset chain and the iterator; the live graph's Python iterator objects and
        # initializers would still point at the old ones. Offline, the exported graph carries both.
        raise ConfigError("input_mode='tfdata_service' works on the offline path only: optimize the exported "
                          "graph (ss.optimize or `smartstage optimize --tfdata-service`), import it and run it "
                          "with ss.start_prefetch_threads (docs/scale-out.md); the session flag cannot apply it")

    def rewrite() -> LiveRewrite:
        start = time.perf_counter()
        staged_takes = [sd.take_node for sd in stage_defs(graph) if sd.origin == "staged" and sd.take_node]
        result = optimize(graph, options, targets=_node_names(targets) + staged_takes)
        was_finalized = graph.finalized
        if was_finalized:
            graph._unsafe_unfinalize()  # noqa: SLF001  (the rewrite happens before any step)
        try:
            record = _apply(graph, result)
        finally:
            if was_finalized:
                graph.finalize()
        record.seconds = time.perf_counter() - start
        return record

    record, new = rewrite_once(graph, rewrite)
    if new:
        logger.info("SmartStage rewrote the session's graph in %.2f s:\n%s", record.seconds, record.summary())
    else:
        logger.debug("graph already rewritten by SmartStage; reusing the rewrite")
    return record


def _apply(graph: tf.Graph, result) -> LiveRewrite:
    from smartstage.session.live_auto_stage import apply_auto_stages, auto_stage_names

    record = LiveRewrite(result=result, notes=tuple(result.notes))
    notes = list(record.notes)
    stages = apply_auto_stages(graph, result, record)  # inserted stages: built once, in their final form
    inserted = auto_stage_names(result)
    for partition in result.partitions:
        if not partition.changes_graph or partition.stage.name in inserted:
            continue
        reason = _unsupported(graph, partition)
        if reason:
            notes.append(f"{partition.stage.name}: left as it was in the session's graph: {reason}")
            continue
        stages.append(_rebuild_stage(graph, partition, record))
    _copy_devices(graph, result)
    notes.extend(apply_input_tasks(graph, result))  # scale-out: per-task copies, shards, the marker
    record.stages = tuple(stages)
    record.notes = tuple(notes)
    record.last_id = graph.version
    record.last_op_id = _last_op_id(graph)
    return record


def _last_op_id(graph: tf.Graph) -> int:
    return max(graph._nodes_by_id, default=0)  # noqa: SLF001


def _unsupported(graph: tf.Graph, partition) -> str:
    stage = partition.stage
    if stage.kind != FIFO:
        return f"a {stage.kind} stage is optimized offline only (smartstage.staged builds FIFO queue stages)"
    for name in (stage.put, stage.take, *partition.moved):
        try:
            graph.get_operation_by_name(name)
        except KeyError:
            return f"node {name!r} is not in the live graph (made by a pass that inserts stages)"
    if stage.stage_def is None and not _queue_runners_of(graph, stage.put):
        return ("nothing the session knows runs its put (no StageDef, no QueueRunner); "
                "build the stage with smartstage.staged()")
    return ""


def _queue_runners_of(graph: tf.Graph, put: str) -> list:
    return [qr for qr in graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
            if any(op.name == put for op in getattr(qr, "enqueue_ops", ()))]


def _rebuild_stage(graph: tf.Graph, partition, record: LiveRewrite) -> LiveStage:
    stage = partition.stage
    old = {"put": graph.get_operation_by_name(stage.put), "take": graph.get_operation_by_name(stage.take)}
    old["buffer"] = old["put"].inputs[0].op
    for op in old["buffer"].outputs[0].consumers():
        if op.type in ("QueueCloseV2", "QueueClose"):
            old["cancel" if op.get_attr("cancel_pending_enqueues") else "close"] = op
        elif op.type in ("QueueSizeV2", "QueueSize"):
            old.setdefault("size", op)
    put_inputs = list(old["put"].inputs)[1:]
    moved = {name: graph.get_operation_by_name(name) for name in partition.moved}
    boundary = [graph.get_tensor_by_name(name) for name in partition.boundary_after]
    producers = _dedupe([t.op for t in put_inputs] + list(old["put"].control_inputs))

    # Who reads the take or a moved op from the main side, computed before any edit.
    own = {op.name for op in old.values()}
    consumers: dict[str, tf.Operation] = {}
    for op in (old["take"], *moved.values()):
        for out in op.outputs:
            for c in out.consumers():
                if c.name not in moved and c.name not in own:
                    consumers.setdefault(c.name, c)
        for c in op._control_outputs:  # noqa: SLF001
            if c.name not in moved and c.name not in own:
                consumers.setdefault(c.name, c)

    new = _new_boundary_ops(graph, stage, old, boundary, partition, moved)
    slot = {name: j for j, name in enumerate(partition.boundary_after)}
    take_outputs = new["take"].outputs

    # 1. Moved ops read what the put used to carry.
    for op in moved.values():
        for i, t in enumerate(op.inputs):
            if t.op is old["take"]:
                op._update_input(i, put_inputs[t.value_index])  # noqa: SLF001
        control = list(op.control_inputs)
        if old["take"] in control:
            _set_control_inputs(op, [c for c in control if c is not old["take"]] + producers)

    # 2. Main-side consumers read the new take; control edges from moved ops wait on the new take.
    for op in consumers.values():
        for i, t in enumerate(op.inputs):
            if t.op is old["take"]:
                key = put_inputs[t.value_index].name
            elif t.op.name in moved:
                key = t.name
            else:
                continue
            if key not in slot:
                raise GraphError(f"stage {stage.name!r}: {op.name!r} reads {t.name!r} from the main side, but the "
                                 "partition does not carry it across the stage (an optimizer bug; please report it)")
            op._update_input(i, take_outputs[slot[key]])  # noqa: SLF001
        control = list(op.control_inputs)
        if any(c is old["take"] or c.name in moved for c in control):
            kept = [c for c in control if c is not old["take"] and c.name not in moved]
            reads_take = any(t.op is new["take"] for t in op.inputs)
            _set_control_inputs(op, kept + ([] if reads_take else [new["take"]]))

    # 3. The prefetch threads run the new put from now on. The old put is retired: it fills a queue
    #    nobody takes from, so no tool that finds stages by the graph's shape (an exported copy has no
    #    live record) takes the old buffer for a stage and runs its put, pulling batches from the input.
    old["put"]._update_input(0, new["retired"].outputs[0])  # noqa: SLF001
    _update_stage_defs(graph, stage, new, partition.boundary_after)
    for qr in _queue_runners_of(graph, stage.put):
        qr._enqueue_ops = [new["put"] if op is old["put"] else op for op in qr._enqueue_ops]  # noqa: SLF001
        qr._close_op, qr._cancel_op = new["close"], new["cancel"]  # noqa: SLF001

    # 4. What the session maps: old stage ops -> new ones, carried tensors -> new take outputs.
    for role, op in old.items():
        if role in _ROLES:
            record.op_map[op.name] = new[role]
            for i, out in enumerate(op.outputs):
                if role != "take" and i < len(new[role].outputs):
                    record.tensor_map[out.name] = new[role].outputs[i]
    for k, out in enumerate(old["take"].outputs):
        key = put_inputs[k].name
        if key in slot:
            record.tensor_map[out.name] = take_outputs[slot[key]]
    for op in moved.values():
        record.prefetch_nodes[op.name] = stage.name
        for out in op.outputs:
            if out.name in slot:
                record.tensor_map[out.name] = take_outputs[slot[out.name]]
    record.prefetch_nodes[old["take"].name] = stage.name
    return LiveStage(name=stage.name, old_ops={r: op.name for r, op in old.items()},
                     new_ops={r: op.name for r, op in new.items() if r in _ROLES}, moved=tuple(partition.moved),
                     boundary=tuple(partition.boundary_after))


def _new_boundary_ops(graph, stage, old, boundary, partition, moved) -> dict[str, tf.Operation]:
    """A buffer with the new dtypes and its put, take, close, cancel and size, beside the old ones."""
    dtypes = [t.dtype.base_dtype for t in boundary]
    shapes = [t.shape for t in boundary]
    buffer_def = old["buffer"].node_def
    shared = buffer_def.attr["shared_name"].s.decode() if "shared_name" in buffer_def.attr else ""
    container = buffer_def.attr["container"].s.decode() if "container" in buffer_def.attr else ""
    reroute_sources = [moved[src] for src, _ in partition.control_reroutes]
    new: dict[str, tf.Operation] = {}
    # Reset every scope the caller may be in: devices, control dependencies, colocation, names.
    with graph.as_default(), graph.device(None), graph.control_dependencies(None), \
            graph.colocate_with(None, ignore_existing=True), graph.name_scope(None), \
            graph.name_scope(f"{stage.name}/{NEW_SCOPE}") as scope:
        with graph.device(old["buffer"].device):
            handle = gen_data_flow_ops.fifo_queue_v2(
                component_types=dtypes,
                shapes=shapes if all(s.is_fully_defined() for s in shapes) else [],
                capacity=old["buffer"].get_attr("capacity"),
                container=container,
                shared_name=scope.rstrip("/") if shared else "",
                name="buffer")
            new["close"] = gen_data_flow_ops.queue_close_v2(handle, cancel_pending_enqueues=False, name="close")
            new["cancel"] = gen_data_flow_ops.queue_close_v2(handle, cancel_pending_enqueues=True, name="cancel")
            new["size"] = gen_data_flow_ops.queue_size_v2(handle, name="size").op
        new["buffer"] = handle.op
        with graph.device(old["put"].device):
            new["retired"] = gen_data_flow_ops.fifo_queue_v2(
                component_types=old["buffer"].get_attr("component_types"), capacity=1, name="retired_buffer").op
        with graph.device(old["put"].device), \
                graph.control_dependencies(_dedupe(list(old["put"].control_inputs) + reroute_sources)):
            new["put"] = gen_data_flow_ops.queue_enqueue_v2(
                handle, boundary, timeout_ms=old["put"].get_attr("timeout_ms"), name="put")
        with graph.device(old["take"].device), graph.control_dependencies(list(old["take"].control_inputs)):
            taken = gen_data_flow_ops.queue_dequeue_v2(
                handle, component_types=dtypes, timeout_ms=old["take"].get_attr("timeout_ms"), name="take")
    taken = taken if isinstance(taken, (list, tuple)) else [taken]
    for tensor, shape in zip(taken, shapes):
        tensor.set_shape(shape)
    new["take"] = taken[0].op
    return new


def _update_stage_defs(graph: tf.Graph, stage, new: dict[str, tf.Operation], boundary: tuple[str, ...]) -> None:
    items = graph.get_collection_ref(STAGES_COLLECTION)
    defs = stage_defs(graph)
    for i, stage_def in enumerate(defs):
        if stage_def.put_node != stage.put:
            continue
        for role, field_name in _STAGE_DEF_FIELDS.items():
            setattr(stage_def, field_name, new[role].name)
        del stage_def.boundary_tensors[:]
        stage_def.boundary_tensors.extend(boundary)
        if not isinstance(items[i], StageRecord):  # raw bytes from an import: keep the updated proto
            items[i] = StageRecord(stage_def)


def _copy_devices(graph: tf.Graph, result) -> None:
    """Device changes made by later passes (gpu placement), applied to the live ops."""
    before = {n.name: n.device for n in result.original_graph_def.node}
    for node in result.graph_def.node:
        if node.name in before and node.device != before[node.name]:
            graph.get_operation_by_name(node.name)._set_device(node.device)  # noqa: SLF001


def adopt_late_ops(graph: tf.Graph, record: LiveRewrite) -> int:
    """Rewires ops built after the rewrite that read an old take output or a moved tensor.

    An op built later (an eval metric, a hook's op) that reads `features["label"]` would read the old
    take, which nothing fills anymore: it is rewired to the new take output carrying the same tensor,
    so it sees the batch being trained on. One that reads a tensor that does not cross the stage
    cannot be served: it is recorded in `unservable`, and fetching it raises TargetError naming it.
    Returns how many ops were rewired.
    """
    last = graph.version
    if last <= record.last_id or not record.stages:
        record.last_id = max(record.last_id, last)
        record.last_op_id = max(record.last_op_id, _last_op_id(graph))
        return 0
    by_id = graph._nodes_by_id  # noqa: SLF001
    last_op = _last_op_id(graph)
    # The runtime's own lane ops (built by the prefetch hook's begin() or the session) read the put's
    # inputs on purpose: they are the prefetch side, never a late main-side reader.
    lane_scopes = tuple(f"{sd.name}/{scope}" for sd in stage_defs(graph) for scope in LANE_SCOPES)
    rewired = 0
    for op_id in range(record.last_op_id + 1, last_op + 1):
        if op_id not in by_id:
            continue
        op = by_id[op_id]
        if lane_scopes and op.name.startswith(lane_scopes):
            continue
        changed = False
        for i, t in enumerate(op.inputs):
            if t.name in record.tensor_map:
                op._update_input(i, record.tensor_map[t.name])  # noqa: SLF001
                changed = True
            elif t.op.name in record.prefetch_nodes:
                record.unservable[op.name] = (
                    f"{op.name!r} was built after SmartStage rewrote the graph and reads {t.name!r}, which now "
                    f"runs on the prefetch side of stage '{record.prefetch_nodes[t.op.name]}' and does not cross "
                    "it, so it cannot be computed from the batch being trained on; build it before creating the "
                    "session, or mark the tensor it reads with smartstage.mark_target_node([...]) so it stays on "
                    "the main side"
                )
            elif t.op.name in record.unservable:
                record.unservable[op.name] = record.unservable[t.op.name]
        control = list(op.control_inputs)
        if any(c.name in record.op_map or c.name in record.prefetch_nodes for c in control):
            _set_control_inputs(op, [_main_side_control(record, c) for c in control])
            changed = True
        rewired += changed
    record.last_id = last
    record.last_op_id = last_op
    if rewired:
        logger.info("SmartStage rewired %d op(s) built after the rewrite to the new takes", rewired)
    return rewired


def _main_side_control(record: LiveRewrite, op: tf.Operation) -> tf.Operation:
    """What a main-side control edge on `op` waits for now: the new stage op, or the new take of a moved op."""
    if op.name in record.op_map:
        return record.op_map[op.name]
    if op.name not in record.prefetch_nodes:
        return op
    stage = record.prefetch_nodes[op.name]
    for s in record.stages:
        if s.name == stage:
            return record.op_map[s.old_ops["take"]]
    raise GraphError(f"no rebuilt stage {stage!r} for {op.name!r}")
