"""expand_stage: the CPU rewrite. Moves every movable consumer of each take to the prefetch side.

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss
    after:   reader -> hash -> put ~~ take -> lookup(w) -> loss

Applies the partitions computed by the partition pass: smartstage.passes.rewrite records the edits in an
edit log (smartstage.graph.edits), returned in PassResult.edits and written into a copy of the GraphDef. A stage
whose partition was skipped (empty cut) stays exactly as it was; the summary says why.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def
from smartstage.graph.names import parse_tensor_name
from smartstage.passes.manager import PassContext, PassResult
from smartstage.passes.rewrite import describe_dtypes, rebuild_boundary
from smartstage.passes.stage_defs import replace_stage_def, with_fields


class ExpandStage:
    name = "expand_stage"
    requires = ("partitions",)
    provides = ()

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        todo = [p for p in ctx.partitions if p.changes_graph]
        summary = [f"{p.stage.name}: unchanged: {p.skipped}" for p in ctx.partitions if not p.changes_graph]
        if not todo:
            return PassResult(graph_def, changed=False, summary=tuple(summary))
        log = EditLog(view)
        shape_of = _shapes_from(view)
        boundary_types = {}
        edited: set[str] = set()
        for p in todo:
            dtypes, touched = rebuild_boundary(log, view, p, shape_of(p))
            edited |= touched
            boundary_types[p.stage.name] = dtypes
            summary.append(f"{p.stage.name}: moved {len(p.moved)} node(s) to the prefetch side; the buffer now "
                           f"carries {len(p.boundary_after)} tensor(s) (was {len(p.boundary_before)}): "
                           f"[{describe_dtypes(dtypes)}]")
            if p.control_reroutes:
                summary.append(f"{p.stage.name}: re-routed {len(p.control_reroutes)} control edge(s) across the cut "
                               "through the put and the take")
            if p.stage.stage_def is not None:  # a new StageDef: the partition's and ctx.stages' boundary carry it
                replace_stage_def(ctx, log, p.stage, with_fields(p.stage.stage_def, boundary_tensors=p.boundary_after))
        _move_late_puts(log, view, [p.stage.put for p in todo])
        new = apply_to_graph_def(graph_def, log.edits, view)
        return PassResult(new, changed=True, summary=tuple(summary), details=boundary_types,
                          edited=frozenset(edited), base_view=view, edits=log.edits)


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


def _move_late_puts(log: EditLog, view, puts: list[str]) -> None:
    """A put now reads nodes that came after it: move it to the end, so a GraphDef in topological order
    stays in it (verification and the next run then need no sort). Every other node keeps its place."""
    late = [put for put in puts
            if any(view.position(parse_tensor_name(s).node) > view.position(put) for s in log.inputs_of(put))]
    for put in sorted(late, key=view.position):
        log.move_to_end(put)
