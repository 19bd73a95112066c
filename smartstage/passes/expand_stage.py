"""expand_stage: the CPU rewrite. Moves every movable consumer of each take to the prefetch side.

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss
    after:   reader -> hash -> put ~~ take -> lookup(w) -> loss

Applies the partitions computed by the partition pass (see smartstage.rewrite for the edits). A stage
whose partition was skipped (empty cut) stays exactly as it was; the summary says why.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from smartstage.graph import parse_tensor_name
from smartstage.pipeline import PassContext, PassResult
from smartstage.rewrite import describe_dtypes, rebuild_boundary


class ExpandStage:
    name = "expand_stage"

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        todo = [p for p in ctx.partitions if p.changes_graph]
        summary = [f"{p.stage.name}: unchanged: {p.skipped}" for p in ctx.partitions if not p.changes_graph]
        if not todo:
            return PassResult(graph_def, changed=False, summary=tuple(summary))
        puts = [p.stage.put for p in todo]
        new, index = _writable_copy(graph_def, view, puts)
        shape_of = ctx.extra.get("shape_of") or _shapes_from(view)
        boundary_types = {}
        edited: set[str] = set()
        for p in todo:
            dtypes, touched = rebuild_boundary(new, view, p, shape_of(p), index)
            edited |= touched
            boundary_types[p.stage.name] = dtypes
            summary.append(f"{p.stage.name}: moved {len(p.moved)} node(s) to the prefetch side; the buffer now "
                           f"carries {len(p.boundary_after)} tensor(s) (was {len(p.boundary_before)}): "
                           f"[{describe_dtypes(dtypes)}]")
            if p.control_reroutes:
                summary.append(f"{p.stage.name}: re-routed {len(p.control_reroutes)} control edge(s) across the cut "
                               "through the put and the take")
            if p.stage.stage_def is not None:
                del p.stage.stage_def.boundary_tensors[:]
                p.stage.stage_def.boundary_tensors.extend(p.boundary_after)
        if view.in_written_order():
            _move_late_puts(new, view, puts)
        ctx.extra["boundary_types"] = boundary_types
        return PassResult(new, changed=True, summary=tuple(summary), details=boundary_types,
                          edited=frozenset(edited), base_view=view)


def _shapes_from(view):
    """Shapes of boundary tensors: a take output keeps the old buffer's shape; others use _output_shapes."""

    def for_partition(partition):
        stage = partition.stage
        old = {}
        if stage.buffer and "shapes" in view.node(stage.buffer).attr:
            shapes = view.node(stage.buffer).attr["shapes"].list.shape
            for i, src in enumerate(stage.put_data_inputs(view)):
                if i < len(shapes):
                    old.setdefault(str(src), shapes[i])

        def shape_of(name):
            return old[name] if name in old else view.output_shape(parse_tensor_name(name))

        return shape_of

    return for_partition


def _writable_copy(graph_def: graph_pb2.GraphDef, view, puts: list[str]):
    """The copy the rewrite edits, and where each node is in it.

    A GraphDef in topological order is copied as it is (_move_late_puts keeps it sorted). One that is
    not is copied in the order the analysis used (`view.order()`), puts last, which the rewrite keeps
    topological: the result is sorted either way, so verification and the next run need no sort.
    """
    new = graph_pb2.GraphDef()
    if view.in_written_order():
        new.CopyFrom(graph_def)
        return new, view.position
    late = set(puts)
    names = [n for n in view.order() if n not in late] + list(puts)
    for field, value in graph_def.ListFields():
        if field.name != "node":
            getattr(new, field.name).CopyFrom(value)
    nodes, position = graph_def.node, view.position
    new.node.extend(nodes[position(n)] for n in names)
    return new, {name: i for i, name in enumerate(names)}.__getitem__


def _move_late_puts(graph_def: graph_pb2.GraphDef, view, puts: list[str]) -> None:
    """A put now reads nodes that came after it: move it to the end, so the GraphDef stays in topological
    order (and TensorFlow imports it as is)."""
    late = []
    for put in puts:
        index = view.position(put)
        node = graph_def.node[index]
        if any(view.position(parse_tensor_name(s).node) > index for s in node.input):
            late.append(index)
    copies = []
    for index in sorted(late, reverse=True):
        copy = type(graph_def.node[index])()
        copy.CopyFrom(graph_def.node[index])
        copies.append(copy)
        del graph_def.node[index]
    graph_def.node.extend(reversed(copies))
