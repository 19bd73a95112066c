"""explain: why a node stayed on the main side, or why it moved, as a chain of nodes.

    before:  reader -> put ~~ take -> hash -> gather(emb/w/read) -> lookup -> loss
    explain(graph, "lookup").text()
      -> "'lookup' stays on the main side of stage 'stage': it reads variable 'emb/w' through 'gather', 'emb/w/read'
          chain: emb/w -> emb/w/read -> gather -> lookup"
    explain(graph, "hash").text()
      -> "'hash' moved to the prefetch side of stage 'stage': ...
          chain: take -> hash"

The verdict comes from optimize() on `graph` (or the OptimizeResult given). A chain is in dataflow
order: from the pinning cause to the node, from the take to a moved node, from a prefetch-side node to
the put. A name that is not a node of the graph raises GraphError with the closest names.
For a graph optimized with `input_job` (scale-out), `placement` says which input task runs the node
("'hash' runs on /job:input/replica:0/task:0 (lane 0) for stage 'stage'; its copies ...").
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from smartstage.inspection.chains import input_path, pin_chain
from smartstage.errors import GraphError
from smartstage.graph.stages import INPUTS
from smartstage.graph.view import GraphView
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.load import load_graph, stage_defs_of
from smartstage.passes.pins import PinRules
from smartstage.inspection.placement import placement_of_node, stage_placements
from smartstage.inspection.sides import FREE, MAIN, PREFETCH_PREFIX, STAGE_PREFIX, graph_sides, stage_of_side

MOVED = "moved"
PINNED = "pinned"
UNCHANGED = "unchanged"  # would move, but its stage stays as it was
PREFETCH = "prefetch"  # on a prefetch side already
MAIN_SIDE = "main"  # on the main side, downstream of no take
FREE_NODE = "free"
STAGE_OP = "stage_op"


@dataclass(frozen=True)
class Explanation:
    """Why `node` is where it is. chain: node names in dataflow order, ending at (or starting from) `node`."""

    node: str
    op: str
    verdict: str
    reason: str
    stage: str | None = None
    chain: tuple[str, ...] = ()
    kind: str | None = None  # the pin kind (variable, feed, target, ...), for pinned nodes
    cause: str | None = None  # the node at the root of a pin
    placement: str | None = None  # which task runs it, when its stage is placed on input tasks (scale-out)

    def text(self) -> str:
        lines = [self.reason]
        if len(self.chain) > 1:
            lines.append("  chain: " + " -> ".join(self.chain))
        if self.placement:
            lines.append("  placement: " + self.placement)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "verdict": self.verdict, "reason": self.reason,
                "stage": self.stage, "chain": list(self.chain), "kind": self.kind, "cause": self.cause,
                "placement": self.placement}


def explain(graph, node: str, *, targets=None, feeds=None, config=None, result=None) -> Explanation:
    """Why `node` (a node or tensor name) of `graph` stays on the main side or moves.

    graph: anything optimize() takes; result: an OptimizeResult of that graph (skips optimizing again).
    Raises GraphError when the graph has no such node, TargetError when `node` names an output the node does
    not have ("loss:7"; the check optimize(targets=) makes), NoStageError when the graph has no stage.
    """
    from smartstage.config.options import enable_smart_stage
    from smartstage.optimizer import optimize

    from smartstage.optimizer import check_ports  # the port check optimize(targets=) makes, word for word

    loaded = load_graph(graph)
    view = GraphView(loaded.graph_def)
    name = _node_name(view, node)
    check_ports(view, [node], "explain NODEs")  # "loss:7" of a one-output node: TargetError, as --target
    if result is None:
        result = optimize(loaded.meta_graph_def if loaded.meta_graph_def is not None else loaded.graph_def,
                          config if config is not None else enable_smart_stage(), targets=targets, feeds=feeds)
    explanation = _explain(loaded, view, name, result)
    placements = stage_placements(_after(result))
    if not placements:
        return explanation
    after_view = GraphView(result.graph_def)
    return dataclasses.replace(explanation, placement=placement_of_node(placements, after_view, name))


def _after(result):
    return result.meta_graph_def if result.meta_graph_def is not None else result.graph_def


def _explain(loaded, view: GraphView, name: str, result) -> Explanation:
    op = view.op(name)
    for p in result.partitions:
        stage = p.stage.name
        if name in p.moved:
            path = _moved_path(view, p, name)
            if p.skipped:
                return Explanation(name, op, UNCHANGED, f"{name!r} could move to the prefetch side of stage {stage!r}, "
                                   f"but the stage stays as it was: {p.skipped}", stage, path)
            return Explanation(name, op, MOVED, _moved_reason(view, p, name, path), stage, path)
        if name in p.pinned:
            pin = p.pinned[name]
            chain = tuple(reversed(pin_chain(view, p.pinned, name)))
            return Explanation(name, op, PINNED, _pinned_reason(name, stage, pin, chain), stage, chain,
                               kind=pin.kind, cause=pin.cause)

    sides = graph_sides(view, stage_defs_of(loaded.meta_graph_def) or
                        [p.stage.stage_def for p in result.partitions if p.stage.stage_def is not None],
                        [p.stage for p in result.partitions if p.stage.kind == INPUTS])
    side = sides.of(name)
    if side.startswith(STAGE_PREFIX):
        stage = stage_of_side(side)
        boundary = sides.stage_named(stage)
        role = next((r for r, n in (("put", boundary.put), ("take", boundary.take), ("buffer", boundary.buffer))
                     if boundary is not None and n == name), "an op")
        if boundary is not None and name in boundary.inputs:
            return Explanation(name, op, STAGE_OP, f"{name!r} is an input of stage {stage!r} (the graph's own "
                               "inputs): it is the boundary itself and belongs to neither side", stage, (name,))
        return Explanation(name, op, STAGE_OP, f"{name!r} is {'the ' + role if role != 'an op' else role} of stage "
                           f"{stage!r}: it is the boundary itself and belongs to neither side", stage, (name,))
    if side.startswith(PREFETCH_PREFIX):
        stage = stage_of_side(side)
        boundary = sides.stage_named(stage)
        path = tuple(reversed(input_path(view, boundary.put, name) or [boundary.put, name]))
        return Explanation(name, op, PREFETCH, f"{name!r} is on the prefetch side of stage {stage!r} already: the "
                           "put needs it, so the prefetch threads compute it", stage, path)
    if side == FREE:
        return Explanation(name, op, FREE_NODE, f"{name!r} is free: it is stateless and computed from constants "
                           "only, so either side evaluates it and it never crosses a boundary", None, (name,))
    assert side == MAIN
    stage_ops = {n for s in sides.stages for n in s.ops}
    own = PinRules(view, set(result.targets), set(), stage_ops).source(name)
    anyway = f"; it would stay anyway: {own.describe()}" if own is not None else ""
    return Explanation(name, op, MAIN_SIDE, f"{name!r} is on the main side and depends on no stage's take, so no "
                       f"stage can carry it{anyway}", None, (name,), kind=own.kind if own else None,
                       cause=own.cause if own else None)


def _node_name(view: GraphView, node: str) -> str:
    if not isinstance(node, str) or not node:
        raise GraphError(f"explain needs a node name, got {node!r}")
    if node in view:
        return node
    parsed = parse_tensor_name(node).node
    if parsed in view:
        return parsed
    names = list(view.names())
    close = difflib.get_close_matches(node, names, n=3, cutoff=0.6)
    if not close:
        tail = node.rsplit("/", 1)[-1]
        close = [n for n in names if n.rsplit("/", 1)[-1] == tail][:3]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise GraphError(f"the graph has no node named {node!r}{hint} (use node names as they appear in the GraphDef; "
                     "'smartstage diff' lists them)")


def _moved_path(view: GraphView, partition, name: str) -> tuple[str, ...]:
    """take -> ... -> name through moved nodes (the shortest such path), in dataflow order; from an input
    node for a boundary at the graph's inputs."""
    takes = set(partition.stage.take_nodes)
    allowed = set(partition.moved) | takes
    parent: dict[str, str | None] = {name: None}
    todo = [name]
    while todo:
        nxt = []
        for current in todo:
            if current in takes:
                path = [current]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return tuple(path)
            for t in view.inputs(current):
                if t.node in allowed and t.node not in parent:
                    parent[t.node] = current
                    nxt.append(t.node)
        todo = nxt
    return (name,)


def _moved_reason(view: GraphView, partition, name: str, path: tuple[str, ...]) -> str:
    stage = partition.stage.name
    crossing = [t for t in partition.boundary_after if parse_tensor_name(t).node == name]
    consumers = [c for c in view.consumers(name) if c not in partition.moved]
    inputs = partition.stage.kind == INPUTS
    source, carrier = ("the graph's inputs", "the boundary") if inputs else ("the stage's take", "the take")
    parts = [f"{name!r} moved to the prefetch side of stage {stage!r}:",
             f"it is computed from {source} ({' -> '.join(path)})" if len(path) > 1 else
             "it is computed on the prefetch side",
             f"by an op ({view.op(name)}) that reads no variable, mutable state or fed value"]
    text = " ".join(parts[:2]) + " " + parts[2]
    if crossing:
        text += (f"; the main side ({', '.join(repr(c) for c in consumers[:3])}"
                 f"{', ...' if len(consumers) > 3 else ''}) now reads {', '.join(crossing)} through {carrier}")
    else:
        text += "; only other moved nodes consume it"
    return text


def _pinned_reason(name: str, stage: str, pin, chain: tuple[str, ...]) -> str:
    head = f"{name!r} stays on the main side of stage {stage!r}:"
    if pin.cause == name:
        return f"{head} {pin.detail}"
    middle = [n for n in chain[1:-1]]
    through = f" through {', '.join(repr(n) for n in reversed(middle))}" if middle else ""
    if pin.detail.startswith("'"):  # a sentence about the cause: "'x' is fed (Placeholder)"
        return f"{head} it depends on {pin.cause!r}{through}, and {pin.detail}"
    return f"{head} it {pin.detail}{through}"
