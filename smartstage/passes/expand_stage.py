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
from smartstage.rewrite import describe_dtypes, node_index, rebuild_boundary


class ExpandStage:
    name = "expand_stage"

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        todo = [p for p in ctx.partitions if p.changes_graph]
        summary = [f"{p.stage.name}: unchanged: {p.skipped}" for p in ctx.partitions if not p.changes_graph]
        if not todo:
            return PassResult(graph_def, changed=False, summary=tuple(summary))
        new = graph_pb2.GraphDef()
        new.CopyFrom(graph_def)
        index = node_index(new)
        shape_of = ctx.extra.get("shape_of") or _shapes_from(view)
        boundary_types = {}
        for p in todo:
            dtypes = rebuild_boundary(new, index, view, p, lambda t, p=p: shape_of(p, t))
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
        ctx.extra["boundary_types"] = boundary_types
        return PassResult(new, changed=True, summary=tuple(summary), details=boundary_types)


def _shapes_from(view):
    """Shapes of boundary tensors: a take output keeps the old buffer's shape; others use _output_shapes."""

    def shape_of(partition, name):
        t = parse_tensor_name(name)
        stage = partition.stage
        puts = stage.put_data_inputs(view)
        if stage.buffer and "shapes" in view.node(stage.buffer).attr:
            old = view.node(stage.buffer).attr["shapes"].list.shape
            for i, src in enumerate(puts):
                if src == t and i < len(old):
                    return old[i]
        return view.output_shape(t)

    return shape_of
