"""Prefetch sides for the GPU passes: per stage, the nodes its put needs, and which the main side uses too.

    sides = prefetch_sides(view, stages)
    sides.side["stage"]            # frozenset of the nodes the put of "stage" needs
    sides.shared                   # those of them the main side evaluates too (a constant both sides read)
    sides.prefetch_only("stage")   # sorted: the side without the shared nodes

Read from the graph as it is now (after the CPU expansion); nothing edits a graph. smartstage.inspection.sides labels
every node of any graph with its side; this is the narrower question the placement passes ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from smartstage.graph.view import GraphView
from smartstage.graph.stages import StageBoundary


@dataclass(frozen=True)
class PrefetchSides:
    """The prefetch side of every stage, read from the graph as it is now (after the CPU expansion).

    side[stage]: the nodes the stage's put needs, not entering any stage's own ops (so a chained
    stage's prefetch side ends at the earlier stage's take). shared: the nodes of some prefetch side
    that the main side evaluates too (a constant both sides read, and what it is computed from);
    main_users[node]: for a shared node read directly by the main side, those main-side readers.
    """

    stage_ops: frozenset[str]
    side: Mapping[str, frozenset[str]]
    owners: Mapping[str, tuple[str, ...]]
    shared: frozenset[str]
    main_users: Mapping[str, tuple[str, ...]]

    def prefetch_only(self, stage: str) -> list[str]:
        return sorted(n for n in self.side.get(stage, ()) if n not in self.shared)


def stage_sides(view: GraphView, stages: Iterable[StageBoundary]) -> dict[str, frozenset[str]]:
    """PrefetchSides.side alone: per stage, the nodes its put needs, not entering any stage's own ops (what the
    fold asks; the shared nodes need every prefetch node's consumers, a sweep over the graph's fanouts)."""
    stages = list(stages)
    stage_ops = frozenset(n for s in stages for n in s.ops)
    side: dict[str, frozenset[str]] = {}
    for stage in stages:
        roots = [t.node for t in view.inputs(stage.put) if t.node in view and t.node not in stage_ops]
        side[stage.name] = frozenset(view.ancestors(roots, stop=set(stage_ops)))
    return side


def prefetch_sides(view: GraphView, stages: Iterable[StageBoundary]) -> PrefetchSides:
    stages = list(stages)
    stage_ops = frozenset(n for s in stages for n in s.ops)
    puts = {s.put for s in stages}
    side = stage_sides(view, stages)
    owners: dict[str, list[str]] = {}
    for stage in stages:
        for n in side[stage.name]:
            owners.setdefault(n, []).append(stage.name)
    on_prefetch = set(owners)
    main_users: dict[str, tuple[str, ...]] = {}
    for name in sorted(on_prefetch):
        users = [c for c in view.consumers(name) if c not in on_prefetch and c not in puts]
        if users:
            main_users[name] = tuple(users)
    shared = frozenset(view.ancestors(main_users, stop=set(stage_ops)) & on_prefetch)
    return PrefetchSides(stage_ops, side, {n: tuple(o) for n, o in owners.items()}, shared, main_users)


__all__ = ["PrefetchSides", "prefetch_sides", "stage_sides"]
