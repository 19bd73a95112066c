"""Applying an optimize() result to the user's live tf.Graph, in place, before the first step.

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss          (the graph the user built)
    after:   reader -> hash -> put' ~~ take' -> lookup(w) -> loss        (the same tf.Graph object)

A session cannot run a rewritten GraphDef copy: the user holds Python handles (train_op, tensors,
savers, hooks, Scaffold, queue runners, iterators) into the graph they built, and importing a copy
loses them. So the session exports the live graph, runs optimize() on the export, and writes the
passes' edit logs (PassReport.edits: the very edits optimize() wrote into its GraphDef) into the live
graph with smartstage.session.live_edits.apply_to_live_graph. What differs from a GraphDef is decided
there: a stage whose boundary dtypes change gets new buffer ops (`<stage>/smart_stage/...`), the old
put is retired, StageDefs and QueueRunners name the new ops; nodes a pass added (auto-stage's stages,
input-task copies, GPU copies) are imported under their names; every other edit is made on the live op.
Nothing is removed or renamed: variables, savers and checkpoints are untouched.

This module adds what only a session needs: the record (session/record.py) of what moved, which maps
fetches (`tensor_map`: a moved or old take tensor -> the take output that carries it now; `op_map`;
`prefetch_nodes`: node -> its stage, for clear errors), and adopt_late_ops for ops built after the rewrite.
A stage the live graph cannot take (not a FIFO queue, or nothing the session knows runs its put) is left
as it was, with a note. The rewrite happens once per graph (`live_rewrite_of(graph)` returns the record)
and only before any session has run the graph: TensorFlow ignores edits of nodes a session has already run.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import tensorflow as tf

from smartstage.config.options import SmartStageOptions
from smartstage.errors import ConfigError, GraphError, TargetError
from smartstage.graph.edits import AddNode, SetStageDef, touched_nodes
from smartstage.graph.stage_names import LANE_SCOPES
from smartstage.graph.stages import FIFO
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.session.live_edits import NEW_SCOPE, ROLES, LiveEdits, apply_to_live_graph, set_control_inputs
from smartstage.session.record import LiveRewrite, LiveStage, rewrite_once

logger = logging.getLogger(__name__)

INPUT_TASKS = "input_tasks"  # the pass whose placement the notes describe
FOLD_DATASET = "fold_dataset"


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

    if options.input_mode == "tf_data_service":
        # The pass replaces the dataset chain and the iterator; the live graph's Python iterator objects and
        # initializers would still point at the old ones. Offline, the exported graph carries both.
        raise ConfigError("input_mode='tf_data_service' works on the offline path only: optimize the exported "
                          "graph (ss.optimize or `smartstage optimize --tf-data-service`), import it and run it "
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
    record = LiveRewrite(result=result, notes=tuple(result.notes))
    notes = list(record.notes)
    inserted = {s.name: s for s in result.auto_stage.inserted} if result.auto_stage is not None else {}
    folded = folded_stages(result)
    expanded, left = [], []
    expand_ran = any(r.name == "expand_stage" for r in result.reports)  # not with the flag off (expand=False)
    for partition in result.partitions:
        if (not expand_ran or not partition.changes_graph or partition.stage.name in inserted
                or partition.stage.name in folded):
            continue
        reason = _unsupported(graph, partition)
        if reason:
            notes.append(f"{partition.stage.name}: left as it was in the session's graph: {reason}")
            left.append(partition)
        else:
            expanded.append(partition)
    # What each expanded stage's put carried before the edits (the old take's outputs, in order).
    carried = {p.stage.name: [t.name for t in graph.get_operation_by_name(p.stage.put).inputs[1:]] for p in expanded}
    carried.update({name: [t.name for t in graph.get_operation_by_name(fit.put).inputs[1:]]
                    for name, fit in folded.items() if name not in inserted})
    applied = apply_to_live_graph(graph, _edits(result, left, folded),
                                  {p.stage.put: p.stage.name for p in result.partitions})
    stages = [_record_inserted(graph, record, stage, result) for stage in inserted.values() if stage.name not in folded]
    stages += [_record_expanded(graph, record, p, applied, carried[p.stage.name]) for p in expanded]
    stages += [_record_folded(graph, record, fit, carried.get(name, [])) for name, fit in folded.items()]
    notes.extend(_input_task_notes(result))
    record.stages = tuple(s for s in stages if s is not None)
    record.notes = tuple(notes)
    record.last_id = graph.version
    record.last_op_id = _last_op_id(graph)
    return record


def folded_stages(result) -> dict:
    """The stages the fold_dataset pass folded into their datasets: stage name -> FoldFit."""
    for report in result.reports:
        if report.name == FOLD_DATASET and report.changed and report.details:
            return {name: fit for name, fit in report.details.items() if fit.folds and not fit.keeps_buffer}
    return {}


def _fold_removals(result) -> set[str]:
    """The old reads and bodies of stages folded that keep their buffer (do_smart_stage_gpu): they leave the
    graph; their stage stays, rebuilt by expand_stage's edits like any expanded stage."""
    for report in result.reports:
        if report.name == FOLD_DATASET and report.changed and report.details:
            return {n for fit in report.details.values() if fit.folds and fit.keeps_buffer
                    for n in (*(set(fit.body) - set(fit.kept)), fit.read)}
    return set()


def _edits(result, left: list, folded: dict | None = None) -> list:
    """Every pass's edits in order, less expand_stage's edits of the stages left as they were, and its
    edits of what a fold removes (a folded stage's buffer ops and body: fold_dataset's log, later, gives
    the main side its final inputs; a live buffer op never needs rebuilding for a stage that is gone)."""
    folded = folded or {}
    own = {n for p in left for n in (*p.take_readers, *p.main_readers, p.stage.put, p.stage.take, *p.stage.ops)}
    gone = {n for fit in folded.values() for n in (*fit.removed, *fit.body, fit.read, fit.put, fit.take)}
    gone |= _fold_removals(result)
    names = {p.stage.name for p in left} | set(folded)
    edits = []
    for report in result.reports:
        if report.name != "expand_stage" or not (left or gone):
            edits.extend(report.edits)
            continue
        kept = [e for e in report.edits if not (touched_nodes([e]) & (own | gone) or
                                                (isinstance(e, SetStageDef) and e.stage_def.name in names))]
        shared = touched_nodes(kept) & own
        if shared:
            raise GraphError(f"node {sorted(shared)[0]!r} is edited for a stage the session's graph cannot take "
                             "and for another one; optimize the exported graph offline instead")
        edits.extend(kept)
    return edits


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


def _record_expanded(graph: tf.Graph, record: LiveRewrite, partition, applied: LiveEdits,
                     carried: list[str]) -> LiveStage:
    """What the session maps for a hand-placed stage: old stage ops -> new ones, carried tensors -> take outputs."""
    stage = partition.stage
    rebuilt = next((s for s in applied.stages if s.old_ops.get("put") == stage.put), None)
    old_ops = rebuilt.old_ops if rebuilt is not None else {"put": stage.put, "take": stage.take}
    new_ops = rebuilt.new_ops if rebuilt is not None else dict(old_ops)
    slot = {name: j for j, name in enumerate(partition.boundary_after)}
    take_outputs = graph.get_operation_by_name(new_ops["take"]).outputs
    for role, name in old_ops.items():
        old, new = graph.get_operation_by_name(name), graph.get_operation_by_name(new_ops[role])
        record.op_map[name] = new
        if role != "take":
            for i, out in enumerate(old.outputs[:len(new.outputs)]):
                record.tensor_map[out.name] = new.outputs[i]
    for out, key in zip(graph.get_operation_by_name(stage.take).outputs, carried):
        if key in slot:
            record.tensor_map[out.name] = take_outputs[slot[key]]
    for name in partition.moved:
        record.prefetch_nodes[name] = stage.name
        for out in graph.get_operation_by_name(name).outputs:
            if out.name in slot:
                record.tensor_map[out.name] = take_outputs[slot[out.name]]
    record.prefetch_nodes[stage.take] = stage.name
    return LiveStage(name=stage.name, old_ops=old_ops, new_ops={r: n for r, n in new_ops.items() if r in ROLES},
                     moved=tuple(partition.moved), boundary=tuple(partition.boundary_after))


def _record_folded(graph: tf.Graph, record: LiveRewrite, fit, carried: list[str]) -> LiveStage:
    """What the session maps for a folded stage: the old take and the carried body tensors -> the outputs
    of the new IteratorGetNext (the batch the step trains on); the body and the old read: prefetch nodes."""
    from smartstage.passes.fold_dataset import read_name

    def live(name: str) -> tf.Operation | None:  # an auto-stage stage's ops were never in the live graph
        try:
            return graph.get_operation_by_name(name)
        except KeyError:
            return None

    read = graph.get_operation_by_name(read_name(fit))
    slot = {_canonical(t): j for j, t in enumerate(fit.outputs)}
    take = live(fit.take)
    if take is not None:
        record.op_map[fit.take] = read
        record.prefetch_nodes[fit.take] = fit.stage
        for out, key in zip(take.outputs, carried):
            if key in slot:
                record.tensor_map[out.name] = read.outputs[slot[key]]
    for name in (*fit.body, fit.read):
        op = live(name)
        if name in fit.kept or op is None:
            continue
        record.prefetch_nodes[name] = fit.stage
        for out in op.outputs:
            if out.name in slot:
                record.tensor_map[out.name] = read.outputs[slot[out.name]]
    return LiveStage(name=fit.stage, old_ops={"put": fit.put, "take": fit.take}, new_ops={"take": read.name},
                     moved=tuple(fit.body), boundary=tuple(fit.outputs), folded_into=fit.iterator)


def _canonical(tensor: str) -> str:
    node, _, port = tensor.partition(":")
    return f"{node.lstrip('^')}:{port or 0}"


def _record_inserted(graph: tf.Graph, record: LiveRewrite, inserted, result) -> LiveStage | None:
    """What the session maps for a stage auto-stage inserted (built in its final form): take outputs, sides."""
    partition = next((p for p in result.partitions if p.stage.name == inserted.name), None)
    stage_def = partition.stage.stage_def if partition is not None else None
    if stage_def is None:  # pragma: no cover - every inserted stage has a partition and a StageDef
        return None
    take = graph.get_operation_by_name(stage_def.take_node)
    for j, tensor in enumerate(stage_def.boundary_tensors):
        record.tensor_map[tensor] = take.outputs[j]
    for name in (*inserted.source.nodes, *partition.moved):
        record.prefetch_nodes[name] = inserted.name
    roles = {"buffer": stage_def.buffer_node, "put": stage_def.put_node, "take": stage_def.take_node,
             "close": stage_def.close_node, "cancel": stage_def.cancel_node, "size": stage_def.size_node}
    logger.info("auto-stage: built stage %s at %s in the session's graph", inserted.name, list(inserted.source.nodes))
    return LiveStage(name=inserted.name, old_ops={}, new_ops=roles, moved=tuple(partition.moved),
                     boundary=tuple(stage_def.boundary_tensors))


def placed_stages(result) -> dict:
    """The stages the input_tasks pass placed on input tasks (none when the pass did not run or skipped them)."""
    for report in result.reports:
        if report.name == INPUT_TASKS and report.changed and report.details:
            return {name: plan for name, plan in report.details.items() if not plan.skipped}
    return {}


def _input_task_notes(result) -> list[str]:
    placed = placed_stages(result)
    if not placed:
        return []
    (report,) = [r for r in result.reports if r.name == INPUT_TASKS]
    added = [e.node.name for e in report.edits if isinstance(e, AddNode)]
    notes = []
    for stage, plan in placed.items():
        owned = sum(1 for n in added if n.startswith(f"{stage}/"))
        notes.append(f"{stage}: prefetch side on {len(plan.tasks)} task(s) of {plan.tasks[0].split('/')[1]} "
                     f"({plan.mode}): {len(plan.body)} node(s) on task 0, {owned} added for the other tasks and the "
                     "plan")
    return notes


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
        folded = {stage.folded_into: stage.name for stage in record.stages if stage.folded_into}
        if op.type in ("MakeIterator", "IteratorGetNext", "IteratorGetNextSync") and op.inputs[-1].op.name in folded:
            # The iterator yields the folded stage's boundary now; a dataset or read built later does not know it.
            record.unservable[op.name] = (
                f"{op.name!r} ({op.type}) was built after SmartStage folded stage '{folded[op.inputs[-1].op.name]}' "
                f"into the dataset of iterator {op.inputs[-1].op.name!r}, whose elements are now that stage's "
                "boundary tensors; build every initializer (make_initializer) and get_next() before creating the "
                "session, or set tf_data_stage='lanes'")
            continue
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
            set_control_inputs(op, [_main_side_control(record, c) for c in control])
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


__all__ = ["NEW_SCOPE", "adopt_late_ops", "placed_stages", "rewrite_live_graph"]
