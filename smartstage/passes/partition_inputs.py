"""partition_inputs: the partition of a graph whose boundary is its own inputs (analysis only, pure).

    before:  batch(Placeholder) -> hash -> lookup(w) -> loss          inputs=("batch",), targets=("loss",)
    result:  moved=(hash,), pinned={lookup: reads variable 'w', loss: ... via 'lookup'},
             boundary_before=(batch:0,), boundary_after=(hash:0,)

A v1 graph names its inputs with a stage (a put and a take around a buffer); a TF2 step's function graph
names them as its placeholders. Both are swept by the same rules (passes.partition.partition_stages): here
the input nodes play the take's role, each standing for its own outputs, and no stage is written into the
graph. What a v1 stage at those inputs would give, this gives: the same moved nodes, pins with reasons,
boundary tensors and skip reason.

Two forms of one rule: `partition_inputs()` for a caller that wants the partition alone, and the pass
`InputBoundary` (name "input_boundary"), which names the boundary for the PassManager so that the same
`Partition` pass v1 graphs run partitions it (smartstage.optimizer.partition_at_inputs).
"""

from __future__ import annotations

from typing import Iterable

from tensorflow.core.framework import graph_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.stages import input_boundary
from smartstage.graph.view import GraphView
from smartstage.passes.partition import StagePartition, check_targets, partition_stages

INPUTS_BOUNDARY = "inputs"


def partition_inputs(graph: graph_pb2.GraphDef | GraphView, inputs: Iterable[str], targets: Iterable[str],
                     feeds: Iterable[str] = (), *, name: str = INPUTS_BOUNDARY) -> StagePartition:
    """Which nodes downstream of `inputs` move before them (to the prefetch side), which stay and why.

    graph: a GraphDef or a GraphView of it. inputs: the input nodes, in the order of the tensors they stand
    for (their output 0 each). targets: what the step runs (its outputs and control outputs); feeds: other
    nodes it feeds. Node or tensor names. The partition's `stage` is input_boundary(name, inputs).
    Raises TargetError for a name that is no node of the graph, GraphError for an input that is also a target
    or a graph with a cycle.

        before:  batch -> hash -> lookup(w) -> loss
        after:   partition_inputs(g, ["batch"], ["loss"]).moved == ("hash",)
    """
    view = graph if isinstance(graph, GraphView) else GraphView(graph)
    inputs, target_set, feed_set = checked_inputs(view, inputs, targets, feeds)
    return partition_stages(view, [input_boundary(name, inputs)], target_set, feed_set)[0]


def checked_inputs(view: GraphView, inputs: Iterable[str], targets: Iterable[str],
                   feeds: Iterable[str]) -> tuple[tuple[str, ...], set[str], set[str]]:
    """(input nodes in order, target nodes, feed nodes) of names given as nodes or tensors; TargetError for a
    name that is no node of the graph, GraphError for an input that is also a target or feed, or a cycle."""
    inputs = tuple(dict.fromkeys(parse_tensor_name(n).node for n in inputs))
    target_set = {parse_tensor_name(n).node for n in targets}
    feed_set = {parse_tensor_name(n).node for n in feeds}
    check_targets(view, set(inputs) | target_set | feed_set)
    both = sorted(set(inputs) & (target_set | feed_set))
    if both:
        raise GraphError(f"partition_inputs(): {both[0]!r} is an input and also a target or feed; an input is "
                         "what the boundary carries: name it as one or the other")
    view.order()  # GraphError naming a cycle
    return inputs, target_set, feed_set


class InputBoundary:
    """Pass: the graph's own input nodes as its one boundary (analysis only), for the Partition pass after it.

        before:  ctx.stages == []                          batch -> hash -> lookup(w) -> loss
        after:   ctx.stages == [input_boundary("inputs", ("batch",))]
    """

    name = "input_boundary"
    requires = ()
    provides = ("stages",)

    def __init__(self, inputs: Iterable[str], name: str = INPUTS_BOUNDARY):
        self.inputs = tuple(inputs)
        self.boundary_name = name

    def run(self, graph_def, ctx):
        from smartstage.passes.manager import PassResult

        inputs, _, _ = checked_inputs(ctx.view_of(graph_def), self.inputs, ctx.targets, ctx.feeds)
        ctx.stages = [input_boundary(self.boundary_name, inputs)]
        return PassResult(graph_def, changed=False, summary=(
            f"{self.boundary_name}: the boundary is the graph's {len(inputs)} input node(s), no stage written",))


__all__ = ["INPUTS_BOUNDARY", "InputBoundary", "checked_inputs", "partition_inputs"]
