"""cut_cost: which moved nodes are cheaper to recompute on the main side than their outputs are to carry, and
whether what is left is worth moving at all (analysis only; one rule for v1 stages, `ss.tf2.split` and `fit`).

    before:  take -> ids -> Unique -> ... (moved)          ids:0 crosses (the embedding lookup reads it)
                        \\-> Shape -> StridedSlice (moved)  StridedSlice:0 crosses (the gradient reads it)
    after:   Shape and StridedSlice stay on the main side, recomputed there from ids:0, which crosses anyway:
             one boundary tensor fewer, two cheap ops more on the main side

Every boundary tensor costs per element: the buffer or the dataset carries it, the step takes it as an
argument. Shape arithmetic (Shape, Size, StridedSlice of shapes, BroadcastGradientArgs ...), ops that only
relabel a buffer (Reshape, ExpandDims, Identity) and fills of a small value to a shape (BroadcastTo, Fill,
ZerosLike: default sample weights, masks) cost less on the main side than their outputs cost to carry.
Which of them stay is a minimum cut: each recomputable moved node either stays moved, or is recomputed on the
main side, where it needs its inputs; the cut minimises (carried tensors' cost + recomputed ops' cost). A node
is recomputed only when every reader of it is on the main side, so nothing runs on both sides and every node
keeps its name. On a tie the node stays moved (the partition as it was).

What is left is worth moving when it holds an op that does work on the batch (anything but metadata ops and
arithmetic on shape-sized tensors: a hash, a string op, a lookup, bucketizing, arithmetic on features). A stage
whose moved part is shape arithmetic only gains nothing a map or a buffer costs;
it stays as it was, with the reason (split() raises SplitError, fit() trains as model.fit would).

The constants are relative costs per element, one carried tensor of a few bytes being 1.0, measured with

    python -m benchmarks.boundary_cost --tf2 --repeats 5 --elements 1500     (TF2: map + prefetch + step call)
    python -m benchmarks.boundary_cost --models '' --ks 1,8,33,64             (v1: FIFOQueueV2 put + take)

Relative numbers (a loaded 2-core machine, 5 interleaved repeats): in the TF2 split one more carried int32
scalar cost 10-35 us per element (map output, prefetch, the iterator's Python tensors, one more argument of
the step), recomputing a StridedSlice + Add of a shape in the step 2-4 us: RECOMPUTE_OP = 0.2 of a carried
tensor. Bytes add little next to that below a few hundred KB (CARRY_PER_KB). The same 64 scalars packed into
one int32[64] tensor cost about a quarter of carrying them apart (smartstage.tf2.step.functions.Packing).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from tensorflow.core.framework import types_pb2

from smartstage.graph.names import CONTROL_PORT, Fanout, TensorName, new_tuple
from smartstage.graph.view import GraphView
from smartstage.passes.min_cut import SINK as _T, SOURCE as _S, FlowNetwork

CARRY_TENSOR = 1.0  # one boundary tensor, per element, whatever its size (the unit)
CARRY_PER_KB = 0.002  # per KB carried, beyond the tensor's own cost
UNKNOWN_KB = 64.0  # a tensor of unknown static size: as a batch-sized feature
RECOMPUTE_OP = 0.2  # one cheap op run again on the main side, per element
SMALL_ELEMENTS = 64  # a shape-like tensor: at most this many elements

# Ops whose outputs alias or describe their input's buffer: O(1) whatever the size.
METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "Reshape", "ExpandDims", "Squeeze", "Identity",
                          "StopGradient", "Snapshot", "BroadcastGradientArgs", "BroadcastArgs"})
# Arithmetic that is cheap on shape-sized tensors (and recomputable only then).
SHAPE_ARITHMETIC_OPS = frozenset({
    "StridedSlice", "Slice", "Pack", "Unpack", "Cast", "ConcatV2", "Concat", "Fill", "ZerosLike", "OnesLike",
    "Add", "AddV2", "Sub", "Mul", "FloorDiv", "FloorMod", "RealDiv", "Maximum", "Minimum", "Prod", "Sum", "Max",
    "Min", "Range", "GatherV2", "DynamicStitch", "Tile", "Neg", "Equal", "NotEqual", "Less", "Greater",
    "LogicalAnd", "SelectV2", "Select",
})
# Ops that materialise a tensor from a shape and a small value (default sample weights, masks of ones): as cheap
# to run again on the main side as to fill a buffer, and never worth carrying. Their value input must be small;
# the shape input (or, for ZerosLike/OnesLike, the tensor whose shape they take) is read anyway or recomputed.
FILL_OPS = frozenset({"Fill", "BroadcastTo", "ZerosLike", "OnesLike"})
_FILL_VALUE_INPUTS = {"Fill": (1,), "BroadcastTo": (0,), "ZerosLike": (), "OnesLike": ()}
CHEAP_OPS = METADATA_OPS | SHAPE_ARITHMETIC_OPS | FILL_OPS
# Ops whose output size is not bounded by their inputs' (Fill(dims) is as large as dims says).
_SIZE_FROM_VALUES = frozenset({"Fill", "Range", "Tile"})
_DERIVING_ARITHMETIC_OPS = SHAPE_ARITHMETIC_OPS - _SIZE_FROM_VALUES  # small when their inputs are
_SHAPE_SOURCES = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "BroadcastArgs"})
_QUEUE_PUTS = frozenset({"QueueEnqueueV2", "QueueEnqueue"})
_QUEUE_TAKES = frozenset({"QueueDequeueV2", "QueueDequeue"})
# Ops whose output relabels their first input's buffer: as small as that input.
_RELABEL_OPS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity", "StopGradient", "Snapshot"})

_DTYPE_BYTES = {types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4, types_pb2.DT_INT64: 8,
                types_pb2.DT_BOOL: 1, types_pb2.DT_HALF: 2, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_INT8: 1,
                types_pb2.DT_UINT8: 1, types_pb2.DT_INT16: 2}
_NUMERIC = frozenset(_DTYPE_BYTES)
_SCALE = 1000  # flow capacities are integers: costs in thousandths of a carried tensor


@dataclass(frozen=True)
class CutPlan:
    """The rule's verdict on one moved set: what is recomputed on the main side and why, and whether the rest
    is worth a map or a buffer."""

    recomputed: Mapping[str, str] = field(default_factory=dict)  # moved node -> the reason it stays
    worth_moving: bool = True
    reason: str = ""  # why nothing is worth moving ("" when something is)
    # (cost_before, cost_after), computed when first asked: the partition needs the verdicts only
    costs: Callable[[], tuple[float, float]] = field(default=lambda: (0.0, 0.0), compare=False, repr=False)

    @property
    def cost_before(self) -> float:  # carried + recomputed cost of the boundary, per element, as partitioned
        return self._costs[0]

    @property
    def cost_after(self) -> float:  # the same after the rule
        return self._costs[1]

    @functools.cached_property
    def _costs(self) -> tuple[float, float]:
        return self.costs()


class _Sizes:
    """Static facts about tensors: their size when `_output_shapes` gives it, and whether they are small
    (shape-like) by shape or by derivation from shape sources.

    Each node is judged once and its verdict kept (one plan asks about a node from several readers, and the
    derivations of many readers share their sources): its output counts and types are read once, its
    smallness decided once, and so are whether it is recomputable and what carrying one of its outputs costs."""

    def __init__(self, view: GraphView):
        self.view = view
        self._small: dict[str, bool] = {}
        self._visiting: set[str] = set()
        self._counts: dict[str, tuple] = {}  # node -> element count of each `_output_shapes` entry (None: unknown)
        self._static: dict[str, bool | tuple[str, ...]] = {}  # node -> its verdict, or the nodes it derives from
        self._recomputable: dict[str, bool] = {}
        self._carry: dict[tuple[str, int], float] = {}
        # A queue stage's take output k is the put's data input k: judged as that tensor, so a rewrite that
        # moves a tensor behind the buffer leaves its size (and the rule's verdict on its readers) unchanged.
        # A take belongs to the put whose buffer it reads (the last such put in graph order): found from the
        # graph's few queue ops, without a walk over every node.
        self._put_of: dict[str, str] = {}
        queue_ops = view.nodes_of_type(_QUEUE_PUTS | _QUEUE_TAKES)
        puts = [n for n in queue_ops if view.op(n) in _QUEUE_PUTS]
        if puts:
            put_of_buffer: dict[str, str] = {}
            for name in puts:  # graph order: a later put of the same buffer wins
                put_of_buffer[view.data_inputs(name)[0].node] = name
            for take in [n for n in queue_ops if view.op(n) in _QUEUE_TAKES]:
                found = [put_of_buffer[t.node] for t in view.inputs(take) if t.node in put_of_buffer]
                if found:
                    self._put_of[take] = max(found, key=view.position)

    def resolved(self, node: str, port: int):
        """The tensor whose size `node:port` has: through a queue stage's take to what its put enqueues (a take
        its own put enqueues again, directly or through other takes, is judged as itself)."""
        seen, put = set(), self._put_of.get(node)
        while put is not None and (node, port) not in seen:
            inputs = self.view.data_inputs(put)[1:]
            if not (port < len(inputs) and inputs[port].node in self.view):
                break
            seen.add((node, port))
            node, port = inputs[port].node, inputs[port].port
            put = self._put_of.get(node)
        return new_tuple(TensorName, (node, port))

    def elements(self, node: str, port: int) -> int | None:
        """The element count of `node:port` when its `_output_shapes` entry is fully defined, else None."""
        counts = self._counts.get(node)
        if counts is None:
            counts = self._counts[node] = self._read_counts(node)
        return counts[port] if port < len(counts) else None

    def _read_counts(self, node: str) -> tuple:
        attr = self.view.node(node).attr
        if "_output_shapes" not in attr:
            return ()
        return tuple(None if s.unknown_rank or any(d.size < 0 for d in s.dim) else _product(d.size for d in s.dim)
                     for s in attr["_output_shapes"].list.shape)

    def small_tensor(self, node: str, port: int) -> bool:
        t = self.resolved(node, port)
        return self.small(t.node)

    def carry(self, node: str, port: int) -> float:
        key = (node, port)
        cost = self._carry.get(key)
        if cost is None:
            t = self.resolved(node, port)
            count = self.elements(t.node, t.port)
            if count is None:
                kb = 0.0 if self.small(t.node) else UNKNOWN_KB
            else:
                dtype = self.view.dtype_of(t)
                kb = count * _DTYPE_BYTES.get(dtype, 8) / 1024
            cost = self._carry[key] = CARRY_TENSOR + CARRY_PER_KB * kb
        return cost

    def small(self, name: str) -> bool:
        """Every output of `name` has at most SMALL_ELEMENTS elements (statically, or as shape arithmetic).

        A node its own types, shapes or op do not decide is small when every input it derives from is
        (_judge); a cycle of derivations (through a queue that re-enqueues what it dequeues) is never small,
        nor is anything derived from one. That makes the verdict a function of the graph alone, whatever order
        the nodes are asked in, so the walk stops at the first input that is not small."""
        verdicts = self._small
        known = verdicts.get(name)
        if known is not None:
            return known
        statics, visiting = self._static, self._visiting
        stack, resume = [name], [0]  # the walk's path, and where each node's inputs are to be read on from
        while stack:  # iterative: a long chain of shape arithmetic must not exhaust Python's stack
            current = stack[-1]
            static = statics.get(current)
            if static is None:
                static = statics[current] = self._judge(current)
            if static is True or static is False:
                verdicts[current] = static
                stack.pop()
                resume.pop()
                continue
            visiting.add(current)
            i, verdict, deeper = resume[-1], True, None
            while i < len(static):
                source = static[i]
                known = verdicts.get(source)
                if known is None:
                    if source in visiting:  # on the walk's path: a cycle
                        verdict = False
                    else:
                        deeper = source
                    break
                if not known:
                    verdict = False
                    break
                i += 1
            if deeper is not None:
                resume[-1] = i
                stack.append(deeper)
                resume.append(0)
                continue
            visiting.discard(current)
            verdicts[current] = verdict
            stack.pop()
            resume.pop()
        return verdicts[name]

    def _judge(self, name: str) -> bool | tuple[str, ...]:
        """The verdict on `name` when its own types, shapes or op decide it; else the nodes (never none) whose
        smallness decides it: the relabelled input of a metadata op, or every input of shape arithmetic."""
        view = self.view
        dtypes = view.output_dtypes(name)
        if not dtypes or not _NUMERIC.issuperset(dtypes):
            return False  # shape arithmetic is numeric: strings, handles and unknown types never are
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = self._read_counts(name)
        if len(counts) >= len(dtypes) and None not in counts[:len(dtypes)]:  # every output's size is known
            return max(counts[:len(dtypes)]) <= SMALL_ELEMENTS
        op = view.op(name)
        if op in _SHAPE_SOURCES:
            return True
        if op == "Const":
            value = view.node(name).attr["value"].tensor
            dims = [d.size for d in value.tensor_shape.dim]
            return all(d >= 0 for d in dims) and _product(dims) <= SMALL_ELEMENTS
        if op in _RELABEL_OPS:
            inputs = view.data_inputs(name)[:1]
        elif op in _DERIVING_ARITHMETIC_OPS:
            inputs = view.data_inputs(name)
        else:
            return False
        put_of = self._put_of
        derived = tuple(self.resolved(t.node, t.port).node if t.node in put_of else t.node
                        for t in inputs if t.node in view)
        return derived or False

    def recomputable(self, name: str) -> bool:
        """recomputable(view, name), decided once per node."""
        verdict = self._recomputable.get(name)
        if verdict is None:
            verdict = self._recomputable[name] = _recomputable(self.view, name, self)
        return verdict


def _product(dims: Iterable[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def recomputable(view: GraphView, name: str, sizes: _Sizes | None = None) -> bool:
    """Whether `name` is cheap enough to run again on the main side: a metadata op, or shape arithmetic on
    small tensors.

        before:  Shape(ids), StridedSlice(Shape(ids)), Reshape(ids, [-1]), BroadcastTo(1.0, Shape(ids)),
                 StringToHashBucketFast(words)
        after:   True, True, True, True, False
    """
    if view.op(name) in METADATA_OPS:
        return True
    return (sizes or _Sizes(view)).recomputable(name)


def _recomputable(view: GraphView, name: str, sizes: _Sizes) -> bool:
    op = view.op(name)
    if op in METADATA_OPS:
        return True
    if op in FILL_OPS:
        inputs = view.data_inputs(name)
        return all(i < len(inputs) and inputs[i].node in view and sizes.small_tensor(inputs[i].node, inputs[i].port)
                   for i in _FILL_VALUE_INPUTS[op])
    return op in SHAPE_ARITHMETIC_OPS and sizes.small(name)


def plan_cut(view: GraphView, moved: Iterable[str], take: str | Sequence[str], *, fixed: Iterable[str] = (),
             crossing_anyway: Iterable[str] = (), fanouts: Callable[[str], Sequence[Fanout]] | None = None) -> CutPlan:
    """Which moved nodes to recompute on the main side (module docstring), and whether the rest is worth moving.

    take: the stage's take, or the nodes in its role (a graph's input nodes: graph.stages.input_boundary).
    moved: the partition's moved nodes; every other reader of a moved node or of `take` is on the main side.
    fixed: moved nodes that must stay moved (pulled random sources). crossing_anyway: tensors ("take:0") that
    cross whatever the rule decides (fetched from the take). fanouts: view.fanouts, or what gives the same
    readers of the take and the moved nodes (the partition's sweep saw them: no index of every node's readers).

        before:  plan_cut(view, moved=["ids", "Shape", "hash"], take="take")   # Shape feeds the main side only
        after:   CutPlan(recomputed={"Shape": "..."}, worth_moving=True)        # ids:0 crosses anyway

    Linear in the moved part and its readers: each node's facts are decided once (_Sizes), and the minimum
    cut is found per component of the flow network (min_cut.FlowNetwork: a few ops per feature).
    """
    fanouts = fanouts or view.fanouts
    takes = (take,) if isinstance(take, str) else tuple(take)
    moved = list(moved)
    moved_set = set(moved)
    sizes = _Sizes(view)
    fixed = set(fixed)
    # A candidate is recomputable, and every moved node that reads it is a candidate: a node read by a moved
    # node that stays moved must run on the prefetch side, so it stays moved too (and so, in turn, do the
    # candidates it reads). The op type rules most nodes out first; only the rest are judged by their sizes.
    candidates = {n for n in moved if n not in fixed and view.op(n) in CHEAP_OPS}
    _keep_read_by(view, candidates, [n for n in moved if n not in candidates])
    for name in reversed(moved):  # readers first (moved is in topological order): what stays is never judged
        if name in candidates and not sizes.recomputable(name):
            candidates.discard(name)
            _keep_read_by(view, candidates, [name])

    # The flow network: S is the prefetch side, T the main side. A candidate on T costs RECOMPUTE_OP (S -> n);
    # a tensor costs its carry once when its producer is on S and a reader is on T (producer -> tensor ->
    # readers, the tensor's reader edges infinite); a candidate's readers follow it to T (reader -> producer,
    # infinite). Edges without a capacity are infinite.
    flow = FlowNetwork()
    anyway = set(crossing_anyway)

    def producer_node(src: str):
        return ("n", src) if src in candidates else _S

    def reader_node(consumer: str):
        if consumer in candidates:
            return ("n", consumer)
        return None if consumer in moved_set or consumer in takes else _T

    recomputed: dict[str, str] = {}
    if candidates:
        # Tensors a candidate produces or reads: any other one crosses, or not, whatever the rule decides.
        relevant = set(candidates)
        for name in candidates:
            relevant.update(t.node for t in view.inputs(name))
        for src in [*takes, *moved]:
            if src not in relevant:
                continue
            readers: dict[int, list[str]] = {}
            for consumer, _, port in fanouts(src):
                if port != CONTROL_PORT:
                    readers.setdefault(port, []).append(consumer)
            for port, consumers in readers.items():
                key = f"{src}:{port}"
                ends = {reader_node(c) for c in consumers} - {None}
                if not ends:
                    continue
                if src not in candidates and (_T in ends or key in anyway) and not (ends - {_T}):
                    continue  # crosses whatever the rule decides, and no candidate reads it
                tensor = ("t", key)
                flow.add_edge(producer_node(src), tensor, round(sizes.carry(src, port) * _SCALE))
                for end in ends:
                    flow.add_edge(tensor, end)
                if key in anyway:
                    flow.add_edge(tensor, _T)
        for name in candidates:
            flow.add_edge(_S, ("n", name), round(RECOMPUTE_OP * _SCALE))
            for consumer, _, _ in fanouts(name):
                if consumer in candidates:
                    flow.add_edge(("n", consumer), ("n", name))
        # The smallest main side among the minimum cuts: what reaches T in the residual graph.
        main_side = flow.sink_side()
        for name in moved:
            if ("n", name) in main_side:
                recomputed[name] = _reason(view, name)
    reason = ""
    if moved and all(sizes.recomputable(n) for n in moved if n not in recomputed):  # no work left to move
        ops = sorted({view.op(n) for n in moved})
        reason = (f"nothing worth moving: the moved part is shape arithmetic only ({', '.join(ops[:6])}"
                  f"{', ...' if len(ops) > 6 else ''}), which cost the step less than a map or a buffer costs per "
                  "element")
    return CutPlan(recomputed=recomputed, worth_moving=not reason, reason=reason,
                   costs=lambda: _boundary_costs(view, moved_set, takes, anyway, sizes, recomputed, fanouts))


def _keep_read_by(view: GraphView, candidates: set[str], staying: list[str]) -> None:
    """Removes from `candidates` every node that a node of `staying` reads, and what those read in turn."""
    while staying:
        for t in view.inputs(staying.pop()):
            if t.node in candidates:
                candidates.discard(t.node)
                staying.append(t.node)


def _boundary_cost(view: GraphView, moved: set[str], take: str, anyway: set[str], sizes: _Sizes,
                   recomputed: Mapping[str, str]) -> float:
    """Per element: every tensor of the take or a moved node that a main-side node reads, carried once, plus
    the recomputed ops."""
    return _boundary_costs(view, moved, (take,), anyway, sizes, recomputed)[1]


def _boundary_costs(view: GraphView, moved: set[str], takes: tuple[str, ...], anyway: set[str], sizes: _Sizes,
                    recomputed: Mapping[str, str], fanouts: Callable[[str], Sequence[Fanout]] | None = None
                    ) -> tuple[float, float]:
    """_boundary_cost with nothing recomputed and with `recomputed`, in one sweep over the boundary (each sum
    taken in the same order as alone, so the same floats)."""
    fanouts = fanouts or view.fanouts
    anyway_ports: dict[str, set[int]] = {}  # ports of `anyway` per node, each set built in the order of `anyway`
    for k in anyway:
        anyway_ports.setdefault(k.rpartition(":")[0], set()).add(int(k.rpartition(":")[2]))
    before = 0.0
    after = RECOMPUTE_OP * len(recomputed)
    for src in [*takes, *moved]:
        uses = fanouts(src)
        ports = {p for c, _, p in uses if p != CONTROL_PORT and c not in moved and c not in takes}
        if src in anyway_ports:
            ports |= anyway_ports[src]
        cost = sum(sizes.carry(src, p) for p in ports)
        before += cost
        if src in recomputed:
            continue
        if recomputed and any(c in recomputed for c, _, _ in uses):
            ports = {p for c, _, p in uses
                     if p != CONTROL_PORT and ((c not in moved and c not in takes) or c in recomputed)}
            if src in anyway_ports:
                ports |= anyway_ports[src]
            cost = sum(sizes.carry(src, p) for p in ports)
        after += cost
    return before, after


def _reason(view: GraphView, name: str) -> str:
    reads = [f"{t.node}:{t.port}" for t in view.data_inputs(name)]
    return (f"{name!r} ({view.op(name)}) is recomputed on the main side: it costs less there than carrying its "
            f"output" + (f", from {', '.join(reads[:3])}{' ...' if len(reads) > 3 else ''}" if reads else ""))


__all__ = ["CARRY_PER_KB", "CARRY_TENSOR", "CHEAP_OPS", "CutPlan", "FILL_OPS", "METADATA_OPS", "RECOMPUTE_OP",
           "SHAPE_ARITHMETIC_OPS", "plan_cut", "recomputable"]
