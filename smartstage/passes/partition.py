"""partition: decide, per stage, which nodes move to the prefetch side and what crosses (analysis only).

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss
    result:  moved=[hash], pinned={lookup: reads variable 'w', loss: ... via 'lookup'},
             boundary_before=[reader:0], boundary_after=[hash:0]

A node downstream of the take moves when its op type allows it (see pins.py) and every input, data or
control, is available on the prefetch side: the take itself, a node that moves, or a free node. A node
that would move but that nothing consumes is pinned as "fetched directly": it exists only to be fetched,
and computing it on the prefetch side would give the value of another batch than the one trained on.

The boundary tensors are named as the prefetch side sees them: a take output stands for the put input
it carries. Order: the old components that still cross, in their old order, then the new ones in
topological order of their producers; each tensor once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from smartstage.graph import CONTROL_PORT, GraphView, TensorName, is_stateful_op
from smartstage.passes.find_stages import StageBoundary
from smartstage.passes.pins import RANDOM_OPS, Pin, PinRules


@dataclass(frozen=True)
class StagePartition:
    """The verdict for one stage: what moves, what stays and why, and what crosses."""

    stage: StageBoundary
    moved: tuple[str, ...] = ()
    pinned: Mapping[str, Pin] = field(default_factory=dict)
    boundary_before: tuple[str, ...] = ()
    boundary_after: tuple[str, ...] = ()
    # Control edges that cross the new cut: (moved source, main-side destination). Re-routed, never dropped.
    control_reroutes: tuple[tuple[str, str], ...] = ()
    # Why the stage stays as it was ("" when the partition is to be applied).
    skipped: str = ""

    @property
    def changes_graph(self) -> bool:
        return bool(self.moved) and not self.skipped


def partition_stages(
    view: GraphView,
    stages: list[StageBoundary],
    targets: set[str],
    feeds: set[str],
    order: list[str],
) -> list[StagePartition]:
    """One StagePartition per stage, computed on the same (unmodified) graph."""
    stage_ops = {n for s in stages for n in s.ops}
    rules = PinRules(view, targets, feeds, stage_ops)
    rules.compute_free(order)
    position = {name: i for i, name in enumerate(order)}
    claimed: set[str] = set()  # sources pulled behind one stage are unavailable to the others
    return [_partition_one(view, stage, rules, position, claimed) for stage in stages]


def _downstream(view: GraphView, stage: StageBoundary) -> set[str]:
    own = set(stage.ops)
    seen: set[str] = set()
    todo = [f.consumer for f in view.fanouts(stage.take)]
    while todo:
        name = todo.pop()
        if name in seen or name in own:
            continue
        seen.add(name)
        todo.extend(f.consumer for f in view.fanouts(name) if f.consumer not in seen)
    return seen


def _pulled_sources(view: GraphView, rules: PinRules, downstream: set[str], claimed: set[str]) -> set[str]:
    """Random ops computed from free inputs only (dropout's noise of a static shape), and the stateless ops
    between them and this stage's downstream: they may move with their consumers, so that they run on the
    prefetch side only. Nodes that are free need no pulling; anything else pinned stays."""
    verdict: dict[str, bool] = {}

    def settle(root: str) -> bool:
        stack = [root]
        while stack:
            name = stack[-1]
            if name in verdict:
                stack.pop()
                continue
            op = view.op(name)
            if (name in downstream or name in claimed or rules.source(name) is not None
                    or (is_stateful_op(op) is not False and op not in RANDOM_OPS)):
                verdict[name] = False
                stack.pop()
                continue
            pending = [t.node for t in view.inputs(name) if t.node not in rules.free and t.node not in verdict]
            if pending:
                stack.append(pending[0])
                continue
            verdict[name] = all(t.node in rules.free or verdict[t.node] for t in view.inputs(name))
            stack.pop()
        return verdict[root]

    pulled: set[str] = set()
    for name in downstream:
        for t in view.inputs(name):
            if t.node not in downstream and t.node not in rules.free and settle(t.node):
                pulled.add(t.node)
    # and everything those depend on that is not free
    todo = list(pulled)
    while todo:
        for t in view.inputs(todo.pop()):
            if t.node not in rules.free and t.node not in pulled:
                pulled.add(t.node)
                todo.append(t.node)
    return pulled


def _partition_one(view: GraphView, stage: StageBoundary, rules: PinRules, position: dict[str, int],
                   claimed: set[str]) -> StagePartition:
    put_inputs = stage.put_data_inputs(view)
    before = tuple(dict.fromkeys(str(t) for t in put_inputs))
    downstream = _downstream(view, stage)
    pulled = _pulled_sources(view, rules, downstream, claimed)
    candidates = sorted(downstream | pulled, key=position.__getitem__)

    moved: dict[str, None] = {}
    pinned: dict[str, Pin] = {}
    for name in candidates:
        pin = None
        for t in view.inputs(name):
            src = t.node
            if src == stage.take or src in moved or src in rules.free:
                continue
            pin = pinned[src].inherited(src) if src in pinned else rules.taint(src).inherited(src)
            break
        if pin is None:
            pin = rules.source(name)
        if pin is None:
            moved[name] = None
        else:
            pinned[name] = pin

    claimed.update(n for n in pulled if n in moved)
    # Nodes nothing consumes exist only to be fetched: they stay, and their inputs cross instead.
    for name in list(moved):
        if not view.fanouts(name):
            del moved[name]
            pinned[name] = Pin("fetched_directly", name,
                               f"nothing consumes {name!r}: it is fetched directly, and on the prefetch side it "
                               "would be computed from another batch than the one trained on")

    def prefetch_name(t: TensorName) -> str:
        return str(put_inputs[t.port]) if t.node == stage.take else str(t)

    crossing: dict[str, int] = {}
    reroutes: dict[tuple[str, str], None] = {}
    own = set(stage.ops)
    for name in [stage.take] + list(moved):
        for f in view.fanouts(name):
            if f.consumer in moved or f.consumer in own:
                continue
            if f.port == CONTROL_PORT:
                if name != stage.take:
                    reroutes[(name, f.consumer)] = None
                continue
            key = prefetch_name(TensorName(name, f.port))
            crossing.setdefault(key, position[name] if name != stage.take else -1)

    old_rank = {t: i for i, t in enumerate(before)}
    after = tuple(sorted(crossing, key=lambda t: (0, old_rank[t], 0) if t in old_rank
                         else (1, crossing[t], int(t.rsplit(":", 1)[1]))))

    skipped = ""
    if not moved:
        first = next(iter(pinned.items()), None)
        skipped = ("nothing to move: the take has no consumers" if first is None else
                   f"nothing to move: every consumer of the take stays on the main side (e.g. {first[0]!r}: "
                   f"{first[1].describe()})")
    elif not after:
        skipped = ("the new cut would carry no tensor (the main side uses this stage only through control edges); "
                   "the stage stays as it was")
    return StagePartition(stage=stage, moved=tuple(moved), pinned=pinned, boundary_before=before,
                          boundary_after=after, control_reroutes=tuple(reroutes), skipped=skipped)


class Partition:
    """Pass: computes each stage's partition (analysis only)."""

    name = "partition"

    def run(self, graph_def, ctx):
        from smartstage.pipeline import PassResult

        view = ctx.view_of(graph_def)
        order = view.topological_order()
        _check_targets(view, ctx.targets | ctx.feeds)
        ctx.partitions = partition_stages(view, ctx.stages, ctx.targets, ctx.feeds, order)
        summary = []
        for p in ctx.partitions:
            verdict = p.skipped or (f"{len(p.moved)} node(s) can move; boundary {len(p.boundary_before)} -> "
                                    f"{len(p.boundary_after)} tensor(s)")
            summary.append(f"{p.stage.name}: {verdict}; {len(p.pinned)} pinned")
        return PassResult(graph_def, changed=False, summary=tuple(summary), details=ctx.partitions)


def _check_targets(view: GraphView, names: set[str]) -> None:
    from smartstage.errors import TargetError

    missing = sorted(n for n in names if n not in view)
    if missing:
        raise TargetError(f"target or feed {missing[0]!r} names no node of the graph"
                          + (f" (nor do {missing[1:]})" if len(missing) > 1 else "")
                          + "; pass node names as they appear in the GraphDef (an op name, or a tensor 'node:0')")
