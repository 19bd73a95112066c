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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping

from smartstage.graph.view import GraphView
from smartstage.graph.stages import StageBoundary, find_stages
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


def graph_sides(view: GraphView, stage_defs: list[StageDef] = ()) -> GraphSides:
    """Finds the stages of `view` (find_stages) and assigns every node a side."""
    stages, notes = find_stages(view, list(stage_defs))
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
        roots = [t.node for t in view.inputs(stage.put) if t.node in view and t.node not in all_stage_ops]
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


def _free_nodes(view: GraphView, rules: PinRules) -> set[str]:
    return {name for name in view.names() if rules.is_free(name)}


def _stage_infrastructure(view: GraphView, stage: StageBoundary) -> list[str]:
    """The stage's own ops, plus the runtime's readiness guard: the take's control inputs and what they
    alone need, inside the stage's name scope (staged() builds ready_buffer, ready_put, ready_check, ...)."""
    names = list(stage.ops)
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
