"""rewrites: the GraphDef rewrites a TF2 split makes of its step's graph, each one call, written as edit
records by the same edit log and applier as the v1 passes (smartstage.graph.edits); they read nothing but
the GraphDef and what the caller hands them.

    replace_nodes   nodes put in the place of others (the stand-ins of a step's captures: smartstage.tf2.step.state)
    cut             the graph cut in two at a partition's boundary: the prefetch side and the main side

The cut:

    before:  batch -> hash -> lookup(w) -> loss                    (the step's graph, moved = {hash})
    prefetch side:  batch -> hash            fetches  hash:0
    main side:      smartstage/boundary/0 -> lookup(w) -> loss   (a new Placeholder reads as hash:0 did)

Both sides are edit logs on the step's own GraphDef, written by one applier:
the main side adds one placeholder per boundary tensor, points every main-side reader of that tensor at
it, and removes the moved nodes and the input placeholders. A control input from a moved node is
re-routed through the dataset element: the prefetch side runs that op before it hands the batch over
(Sides.prefetch_extra), and the main side starts only with the batch as its arguments. The prefetch side
removes every node the boundary tensors do not need. On both sides, a colocation tag ("loc:@x") naming a
node of the other side is dropped: the sides are imported as separate graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def, dedupe_controls, drop_colocation
from smartstage.graph.names import input_source, parse_tensor_name
from smartstage.graph.view import GraphView

BOUNDARY = "smartstage/boundary"


@dataclass(frozen=True)
class Sides:
    """The two GraphDefs and how they connect: boundary tensor k is main_inputs[k] on the main side."""

    prefetch_graph_def: graph_pb2.GraphDef
    main_graph_def: graph_pb2.GraphDef
    boundary: tuple[str, ...]  # tensor names in the step's graph, in boundary order
    main_inputs: tuple[str, ...]  # the placeholder node standing for each boundary tensor on the main side
    prefetch_extra: tuple[str, ...]  # moved ops the prefetch side runs for their effect only (control edges)
    main_edits: tuple = ()
    prefetch_edits: tuple = ()


def main_side_edits(view: GraphView, moved: set[str], inputs: tuple[str, ...], boundary: tuple[str, ...],
                    shapes: dict[str, object]) -> tuple[EditLog, tuple[str, ...]]:
    """The main side: boundary placeholders in, moved nodes and input placeholders out."""
    log = EditLog(view)
    slot, names = {}, []
    for k, tensor in enumerate(boundary):
        t = parse_tensor_name(tensor)
        node = node_def_pb2.NodeDef(name=log.unique_name(f"{BOUNDARY}/{k}"), op="Placeholder")
        node.attr["dtype"].type = view.dtype_of(t)
        if tensor in shapes:
            node.attr["shape"].CopyFrom(attr_value_pb2.AttrValue(shape=shapes[tensor]))
        log.add_node(node)
        slot[tensor] = node.name
        names.append(node.name)
    gone = moved | set(inputs)
    for name in view.names():
        if name in gone:
            continue
        raw = view.raw_inputs(name)
        if not any(input_source(s) in gone for s in raw):
            continue
        new = []
        for s in raw:
            src = input_source(s)
            if src not in gone:
                new.append(s)
            elif s.startswith("^"):
                continue  # ordered already: the main side starts with the batch, which its prefetch side made
            else:
                new.append(slot[str(parse_tensor_name(s))])
        log.set_inputs(name, dedupe_controls(new))
    for name in view.names():
        if name in gone:
            log.remove_node(name)
    drop_colocation(log, view.names(), gone)  # a kept node colocated with a moved one
    return log, tuple(names)


def prefetch_side_edits(view: GraphView, boundary: tuple[str, ...], extra: tuple[str, ...]) -> EditLog:
    """The prefetch side: every node the boundary tensors (and the moved effect-only ops) do not need goes."""
    needed = view.ancestors([parse_tensor_name(t).node for t in boundary] + list(extra))
    log = EditLog(view)
    gone = {name for name in view.names() if name not in needed}
    for name in view.names():
        if name in gone:
            log.remove_node(name)
    drop_colocation(log, needed, gone)  # a moved node colocated with one that stays (a variable's read)
    return log


def replace_nodes(graph_def: graph_pb2.GraphDef, nodes: Sequence[node_def_pb2.NodeDef],
                  renamed: dict[str, str] | None = None,
                  controls: dict[str, Sequence[str]] | None = None) -> graph_pb2.GraphDef:
    """A copy of `graph_def` in which each of `nodes` takes the place of the node of its name (or is added),
    each node `renamed` names ({old: new}) is gone and its readers read the new name instead, and `controls`
    ({node: names}) adds control inputs. A node that keeps its name under another op type is removed, then
    added: two applications, each all or none.

        before:  w(Placeholder) -> read(ReadVariableOp) -> loss
        after:   replace_nodes(g, [NodeDef(name="captured/w", op="VarHandleOp")], {"w": "captured/w"})
                 captured/w(VarHandleOp) -> read -> loss
    """
    renamed, controls = renamed or {}, controls or {}
    view = GraphView(graph_def)
    removals = EditLog(view)
    for name in dict.fromkeys([*renamed, *(n.name for n in nodes if n.name in view)]):
        removals.remove_node(name)
    emptied = apply_to_graph_def(graph_def, removals.edits, view)
    log = EditLog(GraphView(emptied))
    for node in nodes:
        log.add_node(node)
    replaced = {n.name for n in nodes}
    for old, new in renamed.items():
        for reader in view.consumers(old):
            if reader not in replaced:
                log.set_inputs(reader, [s.replace(old, new, 1) if input_source(s) == old else s
                                        for s in log.inputs_of(reader)])
    for name, extra in controls.items():
        log.set_inputs(name, (*log.inputs_of(name), *(f"^{c}" for c in extra)))
    return apply_to_graph_def(emptied, log.edits, log.view)


def cut(graph_def: graph_pb2.GraphDef, moved: tuple[str, ...], inputs: tuple[str, ...], boundary: tuple[str, ...],
        shapes: dict[str, object]) -> Sides:
    """Both sides of the step's graph for one partition (see the module docstring).

        before:  cut(graph_def, moved=("hash",), inputs=("batch",), boundary=("hash:0",), shapes)
        after:   Sides(prefetch_graph_def: batch -> hash, main_graph_def: smartstage/boundary/0 -> lookup -> loss)
    """
    view = GraphView(graph_def)
    moved_set = set(moved)
    # Moved ops that nothing on the prefetch side reads but the main side waited for (an Assert): the
    # prefetch side runs them before handing the batch over.
    needed = view.ancestors([parse_tensor_name(t).node for t in boundary])
    extra = tuple(n for n in moved if n not in needed
                  and any(f.port < 0 and f.consumer not in moved_set for f in view.fanouts(n)))
    main_log, main_inputs = main_side_edits(view, moved_set, inputs, boundary, shapes)
    prefetch_log = prefetch_side_edits(view, boundary, extra)
    return Sides(
        prefetch_graph_def=apply_to_graph_def(graph_def, prefetch_log.edits, view),
        main_graph_def=apply_to_graph_def(graph_def, main_log.edits, view),
        boundary=boundary, main_inputs=main_inputs, prefetch_extra=extra,
        main_edits=main_log.edits, prefetch_edits=prefetch_log.edits)


__all__ = ["BOUNDARY", "Sides", "cut", "main_side_edits", "prefetch_side_edits", "replace_nodes"]
