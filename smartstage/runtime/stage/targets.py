"""Marked targets: nodes the user fetches, kept on the main side by every later rewrite.

The marks live in the graph collection `smartstage_targets` (a list of operations), so
`export_meta_graph` writes them as a `node_list` and `import_meta_graph` restores them; no
environment variable or Python state is involved.

    before:  target = tf.concat([...], 0)
    after:   mark_target_node([target]); target_node_names(graph) == ["concat"]
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from smartstage.errors import TargetError
from smartstage.graph.eager import require_graph_mode
from smartstage.runtime.stage.metadata import TARGETS_COLLECTION


def _operations(nodes: Any) -> list[tf.Operation]:
    found: list[tf.Operation] = []
    for item in tf.nest.flatten(nodes, expand_composites=True):
        if isinstance(item, tf.Operation):
            found.append(item)
        elif isinstance(item, tf.Tensor) or hasattr(item, "op"):
            found.append(item.op)
        else:
            raise TargetError(
                f"mark_target_node: {item!r} is not a tensor or an operation; pass tensors or ops "
                "(or lists and dicts of them) of the graph you train"
            )
    return found


def mark_target_node(nodes: Any) -> list[tf.Operation]:
    """Records tensors or ops (or lists and dicts of them) as targets in their graph.

    Targets stay on the main side: the optimizer never moves them behind a stage. Marking twice
    is harmless. Returns the marked operations.

        before:  target = tf.concat([a, b], 0)
        after:   mark_target_node([target])   # graph collection "smartstage_targets" holds target.op
    """
    require_graph_mode("mark_target_node()", nodes, what="marks nodes of a tf.compat.v1 graph")
    operations = _operations(nodes)
    if not operations:
        return []
    graph = operations[0].graph
    for op in operations:
        if op.graph is not graph:
            raise TargetError(
                f"mark_target_node: {op.name!r} belongs to another graph than {operations[0].name!r}; "
                "mark the targets of one graph at a time"
            )
    already = set(graph.get_collection(TARGETS_COLLECTION))
    for op in operations:
        if op not in already:
            graph.add_to_collection(TARGETS_COLLECTION, op)
            already.add(op)
    return operations


def target_node_names(graph: tf.Graph) -> list[str]:
    """The names of the nodes marked as targets in `graph`, in marking order.

        before:  mark_target_node(loss)
        after:   target_node_names(graph) == ["loss"]
    """
    names: list[str] = []
    for item in graph.get_collection(TARGETS_COLLECTION):
        name = item.name if isinstance(item, tf.Operation) else str(item)
        if name not in names:
            names.append(name)
    return names
