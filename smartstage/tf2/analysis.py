"""analysis: the step's function graph as a v1 stage, partitioned by the same optimize() as every v1 graph.

    before (FuncGraph):  batch(Placeholder) -> hash -> lookup(w) -> loss
    analysis graph:      batch -> put ~~ take -> hash -> lookup(VarHandleOp w) -> loss
    optimize() result:   batch -> hash -> put ~~ take -> lookup(w) -> loss     (moved: hash)

The stage boundary is the function's data inputs: one FIFO stage, STAGE, whose put carries the input
placeholders and whose take stands for them in every reader. Captures are named by what they stand for
(smartstage.tf2.state), and the targets are what the step runs: its outputs and control outputs. The
result is an ordinary OptimizeResult: summary(), diff(), explain and the HTML report all work on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from smartstage.config.options import enable_smart_stage
from smartstage.graph.edits import EditLog, apply_to_graph_def
from smartstage.graph.names import input_source, parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.optimizer import optimize
from smartstage.result import OptimizeResult
from smartstage.tf2.state import CapturedState, classify, random_state_edits, stand_ins
from smartstage.tf2.trace import TracedStep

STAGE = "smartstage/input"
BUFFER, PUT, TAKE = f"{STAGE}/buffer", f"{STAGE}/put", f"{STAGE}/take"


@dataclass(frozen=True)
class Analysis:
    """The analysis graph, the partition optimize() computed on it, and what each capture is."""

    graph_def: graph_pb2.GraphDef  # the step's graph with its inputs behind STAGE and its captures named
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


def _types(dtypes: list[int]) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=dtypes))


def stage_edits(view: GraphView, inputs: tuple[str, ...], log: EditLog) -> None:
    """One FIFO stage whose take stands for the function's data inputs in every reader."""
    dtypes = [view.node(name).attr["dtype"].type for name in inputs]
    buffer = node_def_pb2.NodeDef(name=BUFFER, op="FIFOQueueV2")
    buffer.attr["component_types"].CopyFrom(_types(dtypes))
    buffer.attr["capacity"].i = 1
    put = node_def_pb2.NodeDef(name=PUT, op="QueueEnqueueV2", input=[BUFFER, *inputs])
    put.attr["Tcomponents"].CopyFrom(_types(dtypes))
    take = node_def_pb2.NodeDef(name=TAKE, op="QueueDequeueV2", input=[BUFFER])
    take.attr["component_types"].CopyFrom(_types(dtypes))
    port = {name: k for k, name in enumerate(inputs)}
    for reader in dict.fromkeys(c for name in inputs for c in view.consumers(name)):
        new = []
        for s in log.inputs_of(reader):
            src = input_source(s)
            if src not in port:
                new.append(s)
            elif s.startswith("^"):
                new.append(f"^{TAKE}")
            else:
                new.append(f"{TAKE}:{port[src]}" if parse_tensor_name(s).port == 0 else s)
        log.set_inputs(reader, new)
    for node in (buffer, put, take):
        log.add_node(node)


def _renamed(raw: str, old: str, new: str) -> str:
    src = input_source(raw)
    return raw if src != old else raw.replace(old, new, 1)


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


def analyse(traced: TracedStep, tables: dict[int, object], read_only: bool = True) -> Analysis:
    """The step's partition: its graph staged at its inputs, optimized with the v1 rules.

        before:  traced.graph_def                       # the FuncGraph's GraphDef
        after:   analyse(traced, tables).result.summary()   # moved, pinned with reasons, boundary
    """
    view = GraphView(traced.graph_def)
    states = classify(traced, view, tables, read_only)
    # Two logs: a node keeps its name when a stand-in of another op type takes its place (remove, then add).
    nodes, renamed = stand_ins(view, states, tables, traced)
    removals = EditLog(view)
    for name in [*renamed, *(n.name for n in nodes if n.name in view)]:
        removals.remove_node(name)
    emptied = apply_to_graph_def(traced.graph_def, removals.edits, view)
    log = EditLog(GraphView(emptied))
    for node in nodes:
        log.add_node(node)
    replaced = {n.name for n in nodes}
    for old, new in renamed.items():
        for reader in view.consumers(old):
            if reader not in replaced:
                log.set_inputs(reader, [_renamed(s, old, new) for s in log.inputs_of(reader)])
    random_state_edits(view, log)
    stage_edits(view, traced.inputs, log)
    graph_def = with_output_shapes(apply_to_graph_def(emptied, log.edits, log.view), traced)
    result = optimize(graph_def, enable_smart_stage(), targets=traced.targets)
    return Analysis(graph_def=graph_def, result=result, states=tuple(states))


__all__ = ["Analysis", "BUFFER", "PUT", "STAGE", "TAKE", "analyse", "stage_edits"]
