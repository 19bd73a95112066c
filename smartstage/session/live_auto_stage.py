"""Auto-stage in a session's live tf.Graph: the inserted stages built in place, in their final form.

    before:  iterator -> IteratorGetNext -> decode -> hash -> lookup(w) -> loss          (the user's graph)
    after:   iterator -> IteratorGetNext -> decode -> hash -> smart_stage/put ~~ smart_stage/take -> lookup(w)

A hand-placed stage already has live ops, which smartstage.live_rewrite rebuilds beside the old ones.
An inserted stage has none, so it is created once, as the optimizer's final graph has it (after the
expansion): its nodes are imported from the optimized GraphDef by name (every name is new, the
optimizer made them unique), and every live op whose inputs the optimizer changed because of the
stage gets the same inputs: main-side readers read the take, control edges re-routed across the cut
follow, and each iterator initializer first leaves the stage's stale mark. Nothing is removed or
renamed. The stage's StageDef joins the graph's collection, so the prefetch hook, ss.Session and
start_prefetch_threads run it; fetches of what crosses it are served by its take (LiveRewrite).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from smartstage.graph.names import parse_tensor_name
from smartstage.runtime.stage.metadata import add_stage_def
from smartstage.session.graft import import_new_nodes

logger = logging.getLogger(__name__)


def auto_stage_names(result) -> set[str]:
    """The names of the stages auto-stage inserted in `result` (an OptimizeResult)."""
    report = result.auto_stage
    return {s.name for s in report.inserted} if report is not None else set()


def apply_auto_stages(graph: tf.Graph, result, record) -> list:
    """Builds the stages auto-stage inserted into `graph` (the graph `result` was optimized from) and
    records them in `record` (a LiveRewrite). Returns a LiveStage per stage."""
    from smartstage.session.record import LiveStage, _set_control_inputs

    report = result.auto_stage
    if report is None or not report.inserted:
        return []
    new_names = {n for s in report.inserted for n in s.node_names}
    partitions = {p.stage.name: p for p in result.partitions if p.stage.name in auto_stage_names(result)}
    # Nodes whose control edges the optimizer may have re-routed onto a take: the sources and what moved.
    rerouted = {n for s in report.inserted for n in s.source.nodes}
    rerouted |= {n for p in partitions.values() for n in p.moved}

    import_new_nodes(graph, [n for n in result.graph_def.node if n.name in new_names], "an auto-stage")

    original = {n.name: n for n in result.original_graph_def.node}
    for node in result.graph_def.node:
        old = original.get(node.name)
        if old is None or list(node.input) == list(old.input):
            continue
        if not any(parse_tensor_name(s).node in new_names | rerouted for s in list(node.input) + list(old.input)):
            continue
        op = graph.get_operation_by_name(node.name)
        data = [s for s in node.input if not s.startswith("^")]
        for index, s in enumerate(data):
            t = parse_tensor_name(s)
            if t.node in new_names:
                op._update_input(index, graph.get_tensor_by_name(f"{t.node}:{t.port}"))  # noqa: SLF001
        final_control = {s[1:] for s in node.input if s.startswith("^")}
        control = [c for c in op.control_inputs if c.name in final_control or c.name not in rerouted]
        control += [graph.get_operation_by_name(c) for c in final_control if c in new_names]
        if [c.name for c in control] != [c.name for c in op.control_inputs]:
            _set_control_inputs(op, control)

    stages = []
    for inserted in report.inserted:
        partition = partitions.get(inserted.name)
        stage_def = partition.stage.stage_def if partition is not None else None
        if stage_def is None:  # pragma: no cover - every inserted stage has a partition and a StageDef
            continue
        add_stage_def(graph, stage_def)
        take = graph.get_operation_by_name(stage_def.take_node)
        for j, tensor in enumerate(stage_def.boundary_tensors):
            record.tensor_map[tensor] = take.outputs[j]
        for name in (*inserted.source.nodes, *partition.moved):
            record.prefetch_nodes[name] = inserted.name
        roles = {"buffer": stage_def.buffer_node, "put": stage_def.put_node, "take": stage_def.take_node,
                 "close": stage_def.close_node, "cancel": stage_def.cancel_node, "size": stage_def.size_node}
        stages.append(LiveStage(name=inserted.name, old_ops={}, new_ops=roles, moved=tuple(partition.moved),
                                boundary=tuple(stage_def.boundary_tensors)))
        logger.info("auto-stage: built stage %s at %s in the session's graph", inserted.name,
                    list(inserted.source.nodes))
    return stages


