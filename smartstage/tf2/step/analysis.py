"""analysis: the step's function graph partitioned at its inputs by the v1 passes (optimizer.partition_at_inputs).

    before (FuncGraph):  batch(Placeholder) -> hash -> lookup(w) -> loss
    analysis graph:      batch -> hash -> lookup(VarHandleOp w) -> loss      (captures named, nothing added)
    partition:           moved: hash; pinned: lookup (reads variable 'w'); boundary batch:0 -> hash:0

The boundary is the function's data inputs: its placeholders play the role a v1 stage's take plays, and no
stage is written into the graph; the PassManager runs InputBoundary, then the Partition pass v1 graphs run.
Captures are named by what they stand for (smartstage.tf2.step.state), and the targets are what the step
runs: its outputs and control outputs. The result is an ordinary OptimizeResult whose one partition is at
the inputs: summary(), diff(), explain and the HTML report all work on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import graph_pb2

from smartstage.graph.rewrites import replace_nodes
from smartstage.optimizer import partition_at_inputs
from smartstage.result import OptimizeResult
from smartstage.tf2.step.state import CapturedState, classify, random_state, readers_of, stand_ins
from smartstage.tf2.step.trace import TracedStep


@dataclass(frozen=True)
class Analysis:
    """The analysis graph, its partition at the step's inputs, and what each capture is."""

    graph_def: graph_pb2.GraphDef  # the step's graph with its captures named
    result: OptimizeResult
    states: tuple[CapturedState, ...]

    @property
    def partition(self):
        return self.result.partitions[0]

    @property
    def worth_moving(self) -> bool:
        """Whether the split pays: something moves and it does work (smartstage.passes.cut_cost). When False,
        `why_not` says why; split() raises SplitError with it, fit() trains as model.fit would."""
        return self.partition.changes_graph

    @property
    def why_not(self) -> str:
        """Why nothing worth moving remains ("" when something is)."""
        p = self.partition
        return "" if p.changes_graph else (p.skipped or "nothing to move: no op depends on the batch alone")


def with_output_shapes(graph_def: graph_pb2.GraphDef, traced: TracedStep) -> graph_pb2.GraphDef:
    """`graph_def` with each node of the step's graph annotated with its static output shapes (`_output_shapes`),
    as a v1 graph exported with shapes has them: the cut-cost rule reads tensor sizes from them."""
    graph = traced.concrete.graph
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if "_output_shapes" in node.attr:
            continue
        try:
            op = graph.get_operation_by_name(node.name)
        except (KeyError, ValueError):
            continue  # a stand-in of the analysis graph
        if op.type != node.op:
            continue  # a capture's stand-in under the placeholder's name
        shapes = node.attr["_output_shapes"].list.shape
        for tensor in op.outputs:
            shapes.add().CopyFrom(tensor.shape.as_proto())
    return out


def analysis_graph(traced: TracedStep, tables: dict[int, object],
                   read_only: bool = True) -> tuple[graph_pb2.GraphDef, tuple[CapturedState, ...]]:
    """The step's graph with each capture replaced by a stand-in of what it is, annotated with output shapes;
    and what each capture is.

        before:  batch -> lookup(Placeholder captured 'w')
        after:   batch -> lookup(VarHandleOp 'captured/w'), (CapturedState(kind="variable", ...),)
    """
    readers = readers_of(traced.concrete.graph)
    states = classify(traced, tables, read_only, readers)
    nodes, renamed = stand_ins(traced, states, tables, readers)
    random_nodes, controls = random_state(traced)
    graph_def = replace_nodes(traced.graph_def, nodes + random_nodes, renamed, controls)
    return with_output_shapes(graph_def, traced), tuple(states)


def analyse(traced: TracedStep, tables: dict[int, object], read_only: bool = True) -> Analysis:
    """The step's partition at its inputs, by the v1 rules.

        before:  traced.graph_def                       # the FuncGraph's GraphDef
        after:   analyse(traced, tables).result.summary()   # moved, pinned with reasons, boundary
    """
    graph_def, states = analysis_graph(traced, tables, read_only)
    result = partition_at_inputs(graph_def, traced.inputs, traced.targets)
    return Analysis(graph_def=graph_def, result=result, states=states)


__all__ = ["Analysis", "analyse", "analysis_graph"]
