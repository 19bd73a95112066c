"""Sides: which side of which stage every node of ANY graph is on, read from the graph alone.

    before:  reader -> put ~~ take -> hash -> lookup(w)
             sides: reader=prefetch:q, hash=main, lookup=main, w=main, put/take/q=stage:q
    after:   reader -> hash -> put ~~ take -> lookup(w)
             sides: reader=prefetch:q, hash=prefetch:q, lookup=main, w=main

The prefetch side of a stage is everything its put needs (the ancestors of the put, not entering any
stage's own ops, so a chained stage's prefetch side ends at the earlier stage's take). Everything else
is the main side, except:
- stage ops (the buffer, put, take, close, cancel, size, and the runtime's readiness guard): "stage:<name>";
- free nodes (stateless and computed from constants only, as the optimizer defines them): "free", since
  either side may evaluate them and they never cross a boundary.
A node on the prefetch side of two stages counts for the first one, in find_stages' order.

A boundary at a graph's own inputs (graph.stages.input_boundary) has no op in the graph to find: it is given
(`boundaries`). Its input nodes are its own ops, and its prefetch side is what the tensors it carries need.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from smartstage.graph.load import stage_defs_of
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.graph.stages import INPUTS, StageBoundary, find_stages
from smartstage.passes.pins import PinRules
from smartstage.protos import StageDef

MAIN = "main"
FREE = "free"
PREFETCH_PREFIX = "prefetch:"
STAGE_PREFIX = "stage:"


def prefetch_side(stage: str) -> str:
    return PREFETCH_PREFIX + stage


def stage_of_side(side: str) -> str | None:
    """The stage name of a "prefetch:<stage>" or "stage:<stage>" side; None for main and free."""
    for prefix in (PREFETCH_PREFIX, STAGE_PREFIX):
        if side.startswith(prefix):
            return side[len(prefix):]
    return None


@dataclass(frozen=True)
class GraphSides:
    """The stages of one graph and the side of each of its nodes."""

    stages: tuple[StageBoundary, ...]
    side: Mapping[str, str]
    notes: tuple[str, ...] = ()

    def of(self, name: str) -> str:
        return self.side[name]

    def prefetch_nodes(self, stage: str) -> list[str]:
        key = prefetch_side(stage)
        return [n for n, s in self.side.items() if s == key]

    def stage_named(self, name: str) -> StageBoundary | None:
        return next((s for s in self.stages if s.name == name), None)


def graph_sides(view: GraphView, stage_defs: list[StageDef] = (),
                boundaries: Sequence[StageBoundary] = ()) -> GraphSides:
    """Finds the stages of `view` (find_stages), adds `boundaries` (input boundaries, which no op of the graph
    shows), and assigns every node a side."""
    stages, notes = find_stages(view, list(stage_defs))
    stages += [b for b in boundaries if all(n in view for n in b.ops)]
    stage_op_side: dict[str, str] = {}
    for stage in stages:
        for name in _stage_infrastructure(view, stage):
            stage_op_side.setdefault(name, STAGE_PREFIX + stage.name)
    rules = PinRules(view, set(), set(), set(stage_op_side))
    free = _free_nodes(view, rules)

    side: dict[str, str] = {}
    all_stage_ops = set(stage_op_side)
    for stage in stages:
        label = prefetch_side(stage.name)
        roots = [t.node for t in _put_inputs(view, stage) if t.node in view and t.node not in all_stage_ops]
        for name in view.ancestors(roots, stop=all_stage_ops):
            if name not in free:
                side.setdefault(name, label)
    result: dict[str, str] = {}
    for name in view.names():
        if name in stage_op_side:
            result[name] = stage_op_side[name]
        elif name in side:
            result[name] = side[name]
        else:
            result[name] = FREE if name in free else MAIN
    return GraphSides(stages=tuple(stages), side=result, notes=tuple(notes))


def sides_before_after(before, after, before_view: GraphView, after_view: GraphView,
                       result=None) -> tuple[GraphSides, GraphSides]:
    """The sides of two loaded graphs (graph.load.load_graph), `after` the optimized `before`; with the
    OptimizeResult between them, the stages it found where a graph does not say: the StageDefs a GraphDef
    does not carry, and input boundaries, as they were and as the partition leaves them (carrying the new
    boundary tensors, waiting for what control edges re-route)."""
    before_defs, after_defs = stage_defs_of(before.meta_graph_def), stage_defs_of(after.meta_graph_def)
    partitions = result.partitions if result is not None else ()
    if not after_defs and result is not None and result.meta_graph_def is None:
        # A GraphDef carries no StageDefs: use the ones the optimizer found, where they still name nodes.
        after_defs = [p.stage.stage_def for p in partitions
                      if p.stage.stage_def is not None and p.stage.put in after_view and p.stage.take in after_view]
    if not before_defs:
        before_defs = [p.stage.stage_def for p in partitions
                       if p.stage.stage_def is not None and p.stage.put in before_view and p.stage.take in before_view]
    inputs = [p for p in partitions if p.stage.kind == INPUTS]
    moved = [dataclasses.replace(p.stage, carries=p.boundary_after + tuple(
        dict.fromkeys(f"^{src}" for src, _ in p.control_reroutes))) if p.changes_graph else p.stage for p in inputs]
    return (graph_sides(before_view, before_defs, [p.stage for p in inputs]),
            graph_sides(after_view, after_defs, moved))


def _put_inputs(view: GraphView, stage: StageBoundary) -> list:
    """What the stage's put reads (data and control): for an input boundary, what it carries."""
    if stage.kind == INPUTS:
        return [parse_tensor_name(t) for t in stage.carries]
    return view.inputs(stage.put)


def _free_nodes(view: GraphView, rules: PinRules) -> set[str]:
    return {name for name in view.names() if rules.is_free(name)}


def _stage_infrastructure(view: GraphView, stage: StageBoundary) -> list[str]:
    """The stage's own ops, plus the runtime's readiness guard: the take's control inputs and what they
    alone need, inside the stage's name scope (staged() builds ready_buffer, ready_put, ready_check, ...)."""
    names = list(stage.ops)
    if stage.kind == INPUTS:
        return names
    sd = stage.stage_def
    if sd is not None:
        names += [n for n in (sd.ready_buffer_node, sd.ready_put_node) if n and n in view]
    scope = stage.name + "/"
    guard_roots = [n for n in view.control_inputs(stage.take) if n.startswith(scope)]
    for name in sorted(view.ancestors(guard_roots, stop=set(names))):
        if name.startswith(scope):
            names.append(name)
    return list(dict.fromkeys(names))


def partial_topological_order(view: GraphView) -> list[str]:
    """Kahn's order of every node not on (or behind) a cycle; v1 while loops leave their loop out."""
    indegree = {name: len({t.node for t in view.inputs(name) if t.node in view}) for name in view.names()}
    ready = deque(name for name, d in indegree.items() if d == 0)
    order: list[str] = []
    while ready:
        name = ready.popleft()
        order.append(name)
        for consumer in view.consumers(name):
            indegree[consumer] -= 1
            if indegree[consumer] == 0:
                ready.append(consumer)
    return order
