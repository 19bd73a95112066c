"""Nodes the optimizer added, imported into a session's live tf.Graph under their own names.

    before:  result.graph_def has stage/put, stage/input_task_1/decode ...; the live graph has neither
    after:   import_new_nodes(graph, [those NodeDefs])   # same names, devices, inputs; control edges too

The live rewrite (auto-stage's new stages, the input-task copies) adds what the offline pass added to
the graph the session runs. Inputs from nodes already in the graph are mapped to the live tensors;
control inputs from them are added after the import (import_graph_def maps tensors only); every scope
the caller may be in is reset, and each node keeps the device it has in the optimized graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import parse_tensor_name


def import_new_nodes(graph: tf.Graph, nodes: Sequence[node_def_pb2.NodeDef], what: str) -> None:
    """Imports `nodes` (none of them in `graph` yet) into `graph` under their own names; `what` names them
    in the error raised if one could not keep its name."""
    names = {n.name for n in nodes}
    input_map: dict[str, tf.Tensor] = {}
    outside_control: dict[str, list[str]] = {}
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    for node in nodes:
        copy = graph_def.node.add()
        copy.CopyFrom(node)
        del copy.input[:]
        for raw in node.input:
            t = parse_tensor_name(raw)
            if t.is_control and t.node not in names:
                outside_control.setdefault(node.name, []).append(t.node)
                continue
            copy.input.append(raw)
            if not t.is_control and t.node not in names:
                input_map[f"{t.node}:{t.port}"] = graph.get_operation_by_name(t.node).outputs[t.port]
    with graph.as_default(), graph.device(None), graph.control_dependencies(None), graph.name_scope(None), \
            graph.colocate_with(None, ignore_existing=True):
        tf.graph_util.import_graph_def(graph_def, input_map=input_map or None, name="")
    for node in nodes:
        try:
            op = graph.get_operation_by_name(node.name)
        except KeyError:  # import_graph_def renames on a clash; callers import new names only
            raise GraphError(f"node {node.name!r} of {what} was not imported under its own name "
                             "(an optimizer bug; please report it)") from None
        op._set_device(node.device)  # noqa: SLF001  (colocation handling on import may have reset it)
        if node.name in outside_control:
            op._add_control_inputs([graph.get_operation_by_name(c) for c in outside_control[node.name]])  # noqa: SLF001


__all__ = ["import_new_nodes"]
