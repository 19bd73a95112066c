"""The input-tasks placement (passes/input_tasks.py, docs/scale-out.md) replayed on a session's live tf.Graph.

    before:  reader -> decode -> hash -> put ~~ take                      (the live graph, stages rebuilt)
    after:   reader -> decode@input/task:0 -> hash@input/task:0 -> put ~~ take
                   \\-> stage/input_task_1/decode@input/task:1 -> stage/input_task_1/hash@input/task:1
             stage/input_tasks                                            (NoOp: the plan the runtime reads)

The live rewrite copies device changes only (live_rewrite._copy_devices: the body on task 0). The rest of
what the pass did is replayed here, from the OptimizeResult, on the same tf.Graph:
- the nodes it added: each task's copy (`<stage>/input_task_<i>/...`), the ShardDatasets of sharded mode
  (`<source>/input_shard`) and the marker `<stage>/input_tasks`, imported with their names and devices;
- the existing nodes it re-pointed at them: task 0's readers of a sharded source read its shard, and the
  iterator's initializer waits for every task's copy of it (so running it initializes them all);
- the StageDef's num_threads it raised (one lane per task at least).
Nothing is removed or renamed, as in the rest of the live rewrite.
"""

from __future__ import annotations

import logging

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from smartstage.graph.load import stage_defs_of
from smartstage.graph.names import parse_tensor_name
from smartstage.passes.input_tasks import COPY_SCOPE, MARKER, StageInputPlacement
from smartstage.runtime.stage.metadata import STAGES_COLLECTION, StageRecord, stage_defs
from smartstage.session.graft import import_new_nodes

logger = logging.getLogger(__name__)

PASS_NAME = "input_tasks"
SHARD_SUFFIX = "/input_shard"  # kept equal to passes/input_tasks._add_shards: <source>/input_shard[/num_shards|/index]


def placed_stages(result) -> dict[str, StageInputPlacement]:
    """The stages the input_tasks pass placed on input tasks (none when the pass did not run or skipped them)."""
    for report in result.reports:
        if report.name == PASS_NAME and report.changed and report.details:
            return {name: plan for name, plan in report.details.items() if not plan.skipped}
    return {}


def _added_by_pass(result, placed: dict[str, StageInputPlacement], graph: tf.Graph) -> list[node_def_pb2.NodeDef]:
    """The result's nodes that the input_tasks pass added and the live graph does not have yet."""
    markers = {f"{stage}/{MARKER}" for stage in placed}
    scopes = tuple(f"{stage}/{COPY_SCOPE.format(task)}/" for stage, plan in placed.items()
                   for task in range(1, len(plan.tasks)))
    original = {n.name for n in result.original_graph_def.node}
    added = []
    for node in result.graph_def.node:
        if node.name in original or _exists(graph, node.name):
            continue
        shard = node.name.endswith(SHARD_SUFFIX) or f"{SHARD_SUFFIX}/" in node.name
        if node.name in markers or (scopes and node.name.startswith(scopes)) or shard:
            added.append(node)
    return added


def _exists(graph: tf.Graph, name: str) -> bool:
    try:
        graph.get_operation_by_name(name)
    except KeyError:
        return False
    return True


def _repoint(graph: tf.Graph, result, added: set[str]) -> int:
    """Existing nodes the pass re-pointed at an added node: the same edges on the live ops. Returns how many."""
    changed = 0
    for node in result.graph_def.node:
        if node.name in added or not any(parse_tensor_name(raw).node in added for raw in node.input):
            continue
        op = graph.get_operation_by_name(node.name)
        data = [parse_tensor_name(raw) for raw in node.input if not raw.startswith("^")]
        for index, t in enumerate(data):
            if t.node in added:
                op._update_input(index, graph.get_operation_by_name(t.node).outputs[t.port])  # noqa: SLF001
        control = [graph.get_operation_by_name(raw[1:]) for raw in node.input
                   if raw.startswith("^") and raw[1:] in added]
        if control:
            op._add_control_inputs(control)  # noqa: SLF001
        changed += 1
    return changed


def _raise_num_threads(graph: tf.Graph, result, placed: dict[str, StageInputPlacement]) -> None:
    """num_threads of each placed stage as the pass set it (the runtime runs that many lanes at most)."""
    wanted = {d.name: d.num_threads for d in stage_defs_of(result.meta_graph_def) if d.name in placed}
    items = graph.get_collection_ref(STAGES_COLLECTION)
    for i, stage_def in enumerate(stage_defs(graph)):
        if stage_def.name in wanted and stage_def.num_threads != wanted[stage_def.name]:
            stage_def.num_threads = wanted[stage_def.name]
            if not isinstance(items[i], StageRecord):  # raw bytes from an import: keep the updated proto
                items[i] = StageRecord(stage_def)


def apply_input_tasks(graph: tf.Graph, result) -> list[str]:
    """Replays the input-task placement of `result` on `graph` (device changes already copied); returns notes.

        before:  optimize(graph, input_job="input") placed the body; the live graph has the devices only
        after:   apply_input_tasks(graph, result)   # + stage/input_task_<i>/..., stage/input_tasks, shards
    """
    placed = placed_stages(result)
    if not placed:
        return []
    nodes = _added_by_pass(result, placed, graph)
    if nodes:
        import_new_nodes(graph, nodes, "the input-task placement")
    repointed = _repoint(graph, result, {n.name for n in nodes})
    _raise_num_threads(graph, result, placed)
    notes = []
    for stage, plan in placed.items():
        owned = sum(1 for n in nodes if n.name.startswith(f"{stage}/"))
        notes.append(f"{stage}: prefetch side on {len(plan.tasks)} task(s) of {plan.tasks[0].split('/')[1]} "
                     f"({plan.mode}): {len(plan.body)} node(s) on task 0, {owned} added for the other tasks and the "
                     "plan")
    logger.debug("input-task placement replayed: %d node(s) added, %d re-pointed", len(nodes), repointed)
    return notes


__all__ = ["apply_input_tasks", "placed_stages"]
