"""partition: decide, per stage, which nodes move to the prefetch side and what crosses (analysis only).

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss
    result:  moved=[hash], pinned={lookup: reads variable 'w', loss: ... via 'lookup'},
             boundary_before=[reader:0], boundary_after=[hash:0]

A node downstream of the take moves when its op type allows it (see pins.py) and every input, data or
control, is available on the prefetch side: the take itself, a node that moves, or a free node. A node
that would move but that nothing consumes is pinned as "fetched directly": it exists only to be fetched,
and computing it on the prefetch side would give the value of another batch than the one trained on. A
moved node cheaper to recompute on the main side than its outputs are to carry stays there ("recompute",
cut_cost.py), and a stage whose moved part does no work worth a buffer stays as it was.

The boundary tensors are named as the prefetch side sees them: a take output stands for the put input
it carries. Order: the old components that still cross, in their old order, then the new ones in
topological order of their producers; each tensor once.

A boundary at a graph's own inputs (graph.stages.input_boundary: a TF2 step's placeholders) is swept the
same way, its input nodes in the take's role, each standing for its own outputs (passes.partition_inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from smartstage.graph.names import CONTROL_PORT, Fanout, input_source, new_tuple, parse_input
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import is_stateful_op
from smartstage.graph.stages import INPUTS, StageBoundary
from smartstage.graph.op_types import RANDOM_OPS
from smartstage.passes.cut_cost import plan_cut
from smartstage.passes.pins import Pin, PinRules


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
    # Moved nodes the cut-cost rule keeps on the main side (each also in `pinned`, kind "recompute").
    recomputed: tuple[str, ...] = ()
    # What each output of the old take carried: take:k stood for the put input take_ports[k].
    take_ports: tuple[str, ...] = ()
    # For the rewrite: moved nodes that read the take, and main-side nodes that read the take or a moved node.
    take_readers: tuple[str, ...] = field(default=(), compare=False, repr=False)
    main_readers: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def changes_graph(self) -> bool:
        return bool(self.moved) and not self.skipped


class _StageState:
    """What one pass over the graph learns about one stage."""

    def __init__(self, stage: StageBoundary, view: GraphView):
        self.stage = stage
        self.take = stage.take
        self.takes = frozenset(stage.take_nodes)  # the take, or the input nodes of an input boundary
        self.own = set(stage.ops)
        self.put_inputs = stage.put_data_inputs(view)
        self.verdict: dict[str, Pin | None] = {}  # candidates in topological order: None = moves
        self.pulled: set[str] = set()
        self.reads_take: set[str] = set()

    def carried(self, src: str, port: int) -> str:
        """The tensor output `port` of the take node `src` stands for: the put's input, or itself."""
        return str(self.put_inputs[port]) if src == self.take else f"{src}:{port}"


def partition_stages(
    view: GraphView,
    stages: list[StageBoundary],
    targets: set[str],
    feeds: set[str],
    target_ports: Mapping[str, frozenset[int]] | None = None,
) -> list[StagePartition]:
    """One StagePartition per stage, computed on the same (unmodified) graph in one topological pass.

    A node is a candidate of a stage when it reads that stage's take or one of its candidates; it is
    decided when visited, after all its inputs.

    A take that is a target keeps its outputs crossing even when every reader moves, so a fetch of what
    staged() returned is served by the new take: all of them, or only the ports in `target_ports`
    ({"stage/take": {0}}, for targets named as tensors).
    """
    stage_ops = {n for s in stages for n in s.ops}
    rules = PinRules(view, targets, feeds, stage_ops)
    order = view.order()  # parses every node's inputs
    seeds: list[list[str]] = [[] for _ in stages]
    while True:
        states, consumed, reads = _sweep(view, stages, rules, order, seeds)
        pulled = [[n for n in st.verdict if n in st.pulled] for st in states]
        if pulled == seeds:
            readers = _Readers(view, reads)
            return [_finish(view, st, consumed, _kept_ports(st, targets, target_ports or {}), readers)
                    for st in states]
        # Nodes pulled behind a stage (random sources) may have readers visited before the pull: sweep
        # again with them in place from the start, so one optimize() reaches the fixed point.
        seeds = pulled


class _Readers:
    """view.fanouts() of the takes and candidates, from the reads the sweep saw: the cut-cost rule asks for the
    readers of the moved nodes only, and indexing every node's readers would parse every input of the graph.

    Every reader of a member (a take or a candidate) is seen by the sweep, which visits each node after its
    inputs, except along a v1 while loop's NextIteration -> Merge back edge: a graph with one asks the view."""

    def __init__(self, view: GraphView, reads: dict[str, list[tuple[str, int, str]]]):
        self._view = view
        self._reads = reads  # member -> (reader, input index, input string), in the sweep's order
        self._fanouts: dict[str, list[Fanout]] = {}
        self._exact = not view.nodes_of_type(_NEXT_ITERATION_OPS)
        self._sorted = view.in_written_order()  # the sweep's order is graph order, as view.fanouts() lists them

    def __call__(self, name: str):
        if not self._exact:
            return self._view.fanouts(name)
        fanouts = self._fanouts.get(name)
        if fanouts is None:
            fanouts = [new_tuple(Fanout, (reader, index, parse_input(s).port))
                       for reader, index, s in self._reads.get(name, ())]
            if not self._sorted:
                fanouts.sort(key=lambda f: (self._view.position(f.consumer), f.index))
            self._fanouts[name] = fanouts
        return fanouts


_NEXT_ITERATION_OPS = ("NextIteration", "RefNextIteration")


def _sweep(view: GraphView, stages: list[StageBoundary], rules: PinRules, order: list[str],
           seeds: list[list[str]]) -> tuple[list[_StageState], set[str], dict[str, list[tuple[str, int, str]]]]:
    states = [_StageState(s, view) for s in stages]
    # candidate (or take) -> its stage state; a tuple when a node is downstream of several stages
    member: dict[str, _StageState | tuple] = {take: st for st in states for take in st.takes}
    claimed: set[str] = set()  # sources pulled behind one stage are unavailable to the others
    for st, seed in zip(states, seeds):
        for name in seed:
            st.verdict[name] = None
            st.pulled.add(name)
            member[name] = st
            claimed.add(name)
    consumed: set[str] = set()
    reads: dict[str, list[tuple[str, int, str]]] = {}  # member -> its readers (see _Readers)
    raw_of = view.raw_input_table()
    for name in order:
        raw = raw_of[name]
        owners = None
        for index, s in enumerate(raw):
            st = member.get(s)  # a plain "x" names the node itself
            src = s
            if st is None and (s[0] == "^" or ":" in s):
                src = input_source(s)
                st = member.get(src)
            if st is not None:
                consumed.add(src)  # every reader of a member is a member: only members need counting
                bucket = reads.get(src)
                if bucket is None:
                    reads[src] = [(name, index, s)]
                else:
                    bucket.append((name, index, s))
                if owners is None:
                    owners = st
                elif owners is not st:
                    owners = tuple(dict.fromkeys((owners if isinstance(owners, tuple) else (owners,))
                                                 + (st if isinstance(st, tuple) else (st,))))
        if owners is None or name in claimed:
            continue
        member[name] = owners
        sources = [s if s[0] != "^" and ":" not in s else input_source(s) for s in raw]
        for st in (owners if isinstance(owners, tuple) else (owners,)):
            if name not in st.own:
                st.verdict[name] = _decide(view, rules, st, name, sources, claimed)
    return states, consumed, reads


def _decide(view: GraphView, rules: PinRules, st: _StageState, name: str, sources: list[str],
            claimed: set[str]) -> Pin | None:
    verdict = st.verdict
    pin = None
    for src in sources:
        if src in st.takes:
            st.reads_take.add(name)
            continue
        if pin is not None:
            continue
        if src in verdict:
            if verdict[src] is not None:
                pin = verdict[src].inherited(src)
            continue
        if rules.is_free(src) or (src not in claimed and _pull(view, rules, st, src, claimed)):
            continue
        pin = rules.taint(src).inherited(src)
    return pin if pin is not None else rules.source(name)


def _pull(view: GraphView, rules: PinRules, st: _StageState, root: str, claimed: set[str]) -> bool:
    """Pulls `root` behind the stage when it is a random op computed from free inputs only (dropout's
    noise of a static shape), or stateless over such ops: it then moves with its consumers and runs on
    the prefetch side only. Pulled nodes join the stage's verdicts as moved, before their consumer."""
    decided: dict[str, bool] = {}
    stack = [root]
    while stack:
        name = stack[-1]
        if name in decided:
            stack.pop()
            continue
        if name in st.verdict:  # already decided for this stage: usable when it moves
            decided[name] = st.verdict[name] is None
            stack.pop()
            continue
        op = view.op(name)
        if (name in claimed or rules.source(name) is not None
                or (is_stateful_op(op) is not False and op not in RANDOM_OPS)):
            decided[name] = False
            stack.pop()
            continue
        pending = [t.node for t in view.inputs(name) if t.node not in decided and not rules.is_free(t.node)]
        if pending:
            stack.append(pending[0])
            continue
        decided[name] = all(rules.is_free(t.node) or decided[t.node] for t in view.inputs(name))
        stack.pop()
    if not decided[root]:
        return False
    for name in view.topological_order(n for n, ok in decided.items() if ok and n not in st.verdict):
        st.verdict[name] = None
        st.pulled.add(name)
        claimed.add(name)
    return True


def _kept_ports(st: _StageState, targets: set[str], target_ports: Mapping[str, frozenset[int]]) -> list[int]:
    """The ports of the take that are targets themselves: they keep crossing whatever reads them."""
    if st.take not in targets:
        return []
    ports = target_ports.get(st.take)
    return [k for k in range(len(st.put_inputs)) if ports is None or k in ports]


def _finish(view: GraphView, st: _StageState, consumed: set[str], kept_ports: list[int],
            readers: _Readers) -> StagePartition:
    stage, take, verdict = st.stage, st.take, st.verdict
    before = tuple(dict.fromkeys(str(t) for t in st.put_inputs))
    moved = {n: None for n, pin in verdict.items() if pin is None}
    pinned = {n: pin for n, pin in verdict.items() if pin is not None}
    # Nodes nothing consumes exist only to be fetched: they stay, and their inputs cross instead.
    for name in [n for n in moved if n not in consumed and n not in st.pulled]:  # pulled: read by a candidate
        del moved[name]
        pinned[name] = Pin("fetched_directly", name,
                           f"nothing consumes {name!r}: it is fetched directly, and on the prefetch side it "
                           "would be computed from another batch than the one trained on")
    # What is cheaper to recompute on the main side than to carry stays there (cut_cost.py).
    plan = plan_cut(view, moved, take or stage.take_nodes, fixed=st.pulled,  # an input boundary has no take
                    crossing_anyway=[f"{take}:{port}" for port in kept_ports], fanouts=readers)
    for name, reason in plan.recomputed.items():
        del moved[name]
        pinned[name] = Pin("recompute", name, reason)

    crossing: dict[str, tuple[int, int]] = {}
    reroutes: dict[tuple[str, str], None] = {}
    take_readers: dict[str, None] = {}
    main_readers: dict[str, None] = {}
    old_rank = {t: i for i, t in enumerate(before)}
    for name in moved:
        if name in st.reads_take:
            take_readers[name] = None
    raw_of, crosses = view.raw_input_table(), moved.keys() | st.takes
    for name in pinned:
        for s in raw_of[name]:
            if s in crosses or input_source(s) in crosses:
                break
        else:
            continue  # most pinned nodes (the model, its gradients) read nothing of the stage
        for src, port in view.inputs(name):
            if src not in st.takes and src not in moved:
                continue
            main_readers[name] = None
            if port == CONTROL_PORT:
                if src not in st.takes:
                    reroutes[(src, name)] = None
                continue
            key = st.carried(src, port) if src in st.takes else f"{src}:{port}"
            if key not in crossing:
                crossing[key] = (0, old_rank[key]) if key in old_rank else (1, view.position(src), port)
    for port in kept_ports:  # fetched from the take itself: the batch trained on must carry it
        key = str(st.put_inputs[port])
        crossing.setdefault(key, (0, old_rank[key]))
    # Pulled sources may have readers outside this stage's downstream (visited before the pull): they read
    # the pulled tensor through the take, so it still runs on the prefetch side only.
    for src in st.pulled:
        for consumer, _, port in readers(src):
            if consumer in verdict or consumer in st.own:
                continue
            main_readers[consumer] = None
            if port == CONTROL_PORT:
                reroutes[(src, consumer)] = None
            else:
                crossing.setdefault(f"{src}:{port}", (1, view.position(src), port))
    after = tuple(sorted(crossing, key=crossing.__getitem__))

    skipped = ""
    if not plan.worth_moving:
        skipped = f"{plan.reason}; the stage stays as it was"
    elif not moved:
        first = next(iter(pinned.items()), None)
        take_role = "the inputs" if stage.kind == INPUTS else "the take"
        skipped = (f"nothing to move: {take_role} {'have' if stage.kind == INPUTS else 'has'} no consumers"
                   if first is None else
                   f"nothing to move: every consumer of {take_role} stays on the main side (e.g. {first[0]!r}: "
                   f"{first[1].describe()})")
    elif not after:
        skipped = ("the new cut would carry no tensor (the main side uses this stage only through control edges); "
                   "the stage stays as it was")
    return StagePartition(stage=stage, moved=tuple(moved), pinned=pinned, boundary_before=before,
                          boundary_after=after, control_reroutes=tuple(reroutes), skipped=skipped,
                          take_ports=tuple(str(t) for t in st.put_inputs),
                          take_readers=tuple(take_readers), main_readers=tuple(main_readers),
                          recomputed=tuple(plan.recomputed))


class Partition:
    """Pass: computes each stage's partition (analysis only)."""

    name = "partition"
    requires = ("stages",)
    provides = ("partitions",)

    def run(self, graph_def, ctx):
        from smartstage.passes.manager import PassResult

        view = ctx.view_of(graph_def)
        check_targets(view, ctx.targets | ctx.feeds)
        ctx.partitions = partition_stages(view, ctx.stages, ctx.targets, ctx.feeds,
                                          ctx.target_ports)
        return PassResult(graph_def, changed=False, summary=tuple(partition_line(p) for p in ctx.partitions),
                          details=ctx.partitions)


def partition_line(p: StagePartition) -> str:
    """One line of a partition pass's report: the verdict, the boundary's size before and after, the pins."""
    verdict = p.skipped or (f"{len(p.moved)} node(s) can move; boundary {len(p.boundary_before)} -> "
                            f"{len(p.boundary_after)} tensor(s)")
    return f"{p.stage.name}: {verdict}; {len(p.pinned)} pinned"


def check_targets(view: GraphView, names: set[str]) -> None:
    """TargetError naming the first of `names` that is no node of the graph."""
    from smartstage.errors import TargetError

    missing = sorted(n for n in names if n not in view)
    if missing:
        raise TargetError(f"target or feed {missing[0]!r} names no node of the graph"
                          + (f" (nor do {missing[1:]})" if len(missing) > 1 else "")
                          + "; pass node names as they appear in the GraphDef (an op name, or a tensor 'node:0')")
