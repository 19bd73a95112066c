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
one int32[64] tensor cost about a quarter of carrying them apart (smartstage.tf2.functions.Packing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from tensorflow.core.framework import types_pb2

from smartstage.graph.names import CONTROL_PORT
from smartstage.graph.view import GraphView

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
_SHAPE_SOURCES = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "BroadcastArgs"})
_QUEUE_PUTS = frozenset({"QueueEnqueueV2", "QueueEnqueue"})
_QUEUE_TAKES = frozenset({"QueueDequeueV2", "QueueDequeue"})

_DTYPE_BYTES = {types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4, types_pb2.DT_INT64: 8,
                types_pb2.DT_BOOL: 1, types_pb2.DT_HALF: 2, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_INT8: 1,
                types_pb2.DT_UINT8: 1, types_pb2.DT_INT16: 2}
_SCALE = 1000  # flow capacities are integers: costs in thousandths of a carried tensor


@dataclass(frozen=True)
class CutPlan:
    """The rule's verdict on one moved set: what is recomputed on the main side and why, and whether the rest
    is worth a map or a buffer."""

    recomputed: Mapping[str, str] = field(default_factory=dict)  # moved node -> the reason it stays
    worth_moving: bool = True
    reason: str = ""  # why nothing is worth moving ("" when something is)
    cost_before: float = 0.0  # carried + recomputed cost of the boundary, per element, as partitioned
    cost_after: float = 0.0  # the same after the rule


def _elements(view: GraphView, tensor: str, port: int) -> int | None:
    shape = view.output_shape(_Tensor(tensor, port))
    if shape is None or shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        return None
    count = 1
    for d in shape.dim:
        count *= d.size
    return count


class _Tensor:  # the (node, port) pair GraphView's accessors read
    __slots__ = ("node", "port")

    def __init__(self, node: str, port: int):
        self.node, self.port = node, port


class _Sizes:
    """Static facts about tensors: their size when `_output_shapes` gives it, and whether they are small
    (shape-like) by shape or by derivation from shape sources."""

    def __init__(self, view: GraphView):
        self.view = view
        self._small: dict[str, bool] = {}
        self._visiting: set[str] = set()
        # A queue stage's take output k is the put's data input k: judged as that tensor, so a rewrite that
        # moves a tensor behind the buffer leaves its size (and the rule's verdict on its readers) unchanged.
        self._put_of: dict[str, str] = {}
        for name in view.names():
            if view.op(name) in _QUEUE_PUTS:
                buffer = view.data_inputs(name)[0].node
                for reader in view.consumers(buffer):
                    if view.op(reader) in _QUEUE_TAKES:
                        self._put_of[reader] = name

    def resolved(self, node: str, port: int):
        """The tensor whose size `node:port` has: through a queue stage's take to what its put enqueues."""
        put = self._put_of.get(node)
        if put is not None:
            inputs = self.view.data_inputs(put)[1:]
            if port < len(inputs) and inputs[port].node in self.view:
                return self.resolved(inputs[port].node, inputs[port].port)
        return _Tensor(node, port)

    def small_tensor(self, node: str, port: int) -> bool:
        t = self.resolved(node, port)
        return self.small(t.node)

    def carry(self, node: str, port: int) -> float:
        t = self.resolved(node, port)
        count = _elements(self.view, t.node, t.port)
        if count is None:
            kb = 0.0 if self.small(t.node) else UNKNOWN_KB
        else:
            dtype = self.view.dtype_of(t)
            kb = count * _DTYPE_BYTES.get(dtype, 8) / 1024
        return CARRY_TENSOR + CARRY_PER_KB * kb

    def small(self, name: str) -> bool:
        """Every output of `name` has at most SMALL_ELEMENTS elements (statically, or as shape arithmetic)."""
        stack = [name]
        while stack:  # iterative: a long chain of shape arithmetic must not exhaust Python's stack
            current = stack[-1]
            if current in self._small:
                stack.pop()
                continue
            pending = [t.node for t in self._derived_from(current) if t.node not in self._small]
            if pending and current not in self._visiting:
                self._visiting.add(current)
                stack.extend(pending)
                continue
            self._visiting.discard(current)
            self._small[current] = self._verdict(current)
            stack.pop()
        return self._small[name]

    def _derived_from(self, name: str) -> list:
        """The inputs whose smallness decides that of `name` (none when its own shape or type decides)."""
        view = self.view
        op = view.op(name)
        dtypes = view.output_dtypes(name) or []
        if not dtypes or any(d not in _DTYPE_BYTES for d in dtypes) or op in _SHAPE_SOURCES or op == "Const":
            return []
        if all(_elements(view, name, p) is not None for p in range(len(dtypes))):
            return []
        if op in ("Reshape", "ExpandDims", "Squeeze", "Identity", "StopGradient", "Snapshot"):
            return [self.resolved(t.node, t.port) for t in view.data_inputs(name)[:1] if t.node in view]
        if op in SHAPE_ARITHMETIC_OPS and op not in _SIZE_FROM_VALUES:
            return [self.resolved(t.node, t.port) for t in view.data_inputs(name) if t.node in view]
        return []

    def _verdict(self, name: str) -> bool:
        view = self.view
        op = view.op(name)
        dtypes = view.output_dtypes(name) or []
        counts = [_elements(view, name, p) for p in range(len(dtypes))]
        if not dtypes or any(d not in _DTYPE_BYTES for d in dtypes):
            return False  # shape arithmetic is numeric: strings, handles and unknown types never are
        if all(c is not None for c in counts):
            return all(c <= SMALL_ELEMENTS for c in counts)
        if op in _SHAPE_SOURCES:
            return True
        if op == "Const":
            value = view.node(name).attr["value"].tensor
            dims = [d.size for d in value.tensor_shape.dim]
            return all(d >= 0 for d in dims) and _product(dims) <= SMALL_ELEMENTS
        data = self._derived_from(name)
        # a node still being decided higher up the stack is part of a cycle: never small
        return bool(data) and all(self._small.get(t.node, False) for t in data)


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
    op = view.op(name)
    if op in METADATA_OPS:
        return True
    sizes = sizes or _Sizes(view)
    if op in FILL_OPS:
        inputs = view.data_inputs(name)
        return all(i < len(inputs) and inputs[i].node in view and sizes.small_tensor(inputs[i].node, inputs[i].port)
                   for i in _FILL_VALUE_INPUTS[op])
    return op in SHAPE_ARITHMETIC_OPS and sizes.small(name)


def plan_cut(view: GraphView, moved: Iterable[str], take: str, *, fixed: Iterable[str] = (),
             crossing_anyway: Iterable[str] = ()) -> CutPlan:
    """Which moved nodes to recompute on the main side (module docstring), and whether the rest is worth moving.

    moved: the partition's moved nodes; every other reader of a moved node or of `take` is on the main side.
    fixed: moved nodes that must stay moved (pulled random sources). crossing_anyway: tensors ("take:0") that
    cross whatever the rule decides (fetched from the take).

        before:  plan_cut(view, moved=["ids", "Shape", "hash"], take="take")   # Shape feeds the main side only
        after:   CutPlan(recomputed={"Shape": "..."}, worth_moving=True)        # ids:0 crosses anyway
    """
    import networkx as nx

    moved = list(moved)
    moved_set = set(moved)
    sizes = _Sizes(view)
    fixed = set(fixed)
    candidates = {n for n in moved if n not in fixed and recomputable(view, n, sizes)}
    # A node read by a moved node that stays moved must run on the prefetch side: it stays moved too.
    changed = True
    while changed:
        changed = False
        for name in list(candidates):
            if any(f.consumer in moved_set and f.consumer not in candidates for f in view.fanouts(name)):
                candidates.discard(name)
                changed = True

    # The flow graph: S is the prefetch side, T the main side. A candidate on T costs RECOMPUTE_OP (S -> n);
    # a tensor costs its carry once when its producer is on S and a reader is on T (producer -> tensor ->
    # readers, the tensor's reader edges infinite); a candidate's readers follow it to T (reader -> producer,
    # infinite). Edges without a capacity are infinite.
    flow = nx.DiGraph()
    flow.add_node("S")
    flow.add_node("T")
    anyway = set(crossing_anyway)

    def producer_node(src: str) -> str:
        return ("n", src) if src in candidates else "S"

    def reader_node(consumer: str):
        if consumer in candidates:
            return ("n", consumer)
        return None if consumer in moved_set or consumer == take else "T"

    for src in [take, *moved]:
        fanouts = view.fanouts(src)
        readers: dict[int, list[str]] = {}
        for consumer, _, port in fanouts:
            if port != CONTROL_PORT:
                readers.setdefault(port, []).append(consumer)
        for port, consumers in readers.items():
            key = f"{src}:{port}"
            ends = {reader_node(c) for c in consumers} - {None}
            if not ends:
                continue
            cost = sizes.carry(src, port)
            if src not in candidates and ("T" in ends or key in anyway) and not (ends - {"T"}):
                continue  # crosses whatever the rule decides, and no candidate reads it
            flow.add_edge(producer_node(src), ("t", key), capacity=round(cost * _SCALE))
            for end in ends:
                flow.add_edge(("t", key), end)
            if key in anyway:
                flow.add_edge(("t", key), "T")
    for name in candidates:
        flow.add_edge("S", ("n", name), capacity=round(RECOMPUTE_OP * _SCALE))
        for consumer, _, _ in view.fanouts(name):
            if consumer in candidates:
                flow.add_edge(("n", consumer), ("n", name))

    recomputed: dict[str, str] = {}
    if candidates and flow.has_node("T") and flow.in_degree("T"):
        residual = nx.algorithms.flow.preflow_push(flow, "S", "T")
        # The smallest main side among the minimum cuts: what reaches T in the residual graph.
        main_side, todo = {"T"}, ["T"]
        while todo:
            v = todo.pop()
            for u in residual.predecessors(v):
                edge = residual[u][v]
                if u not in main_side and edge["capacity"] - edge["flow"] > 0:
                    main_side.add(u)
                    todo.append(u)
        for name in moved:
            if ("n", name) in main_side:
                recomputed[name] = _reason(view, name)
    cost_before = _boundary_cost(view, moved_set, take, anyway, sizes, {})
    cost_after = _boundary_cost(view, moved_set, take, anyway, sizes, recomputed)
    left = [n for n in moved if n not in recomputed]
    work = [n for n in left if not recomputable(view, n, sizes)]
    reason = ""
    if moved and not work:
        ops = sorted({view.op(n) for n in moved})
        reason = (f"nothing worth moving: the moved part is shape arithmetic only ({', '.join(ops[:6])}"
                  f"{', ...' if len(ops) > 6 else ''}), which cost the step less than a map or a buffer costs per "
                  "element")
    return CutPlan(recomputed=recomputed, worth_moving=not reason, reason=reason, cost_before=cost_before,
                   cost_after=cost_after)


def _boundary_cost(view: GraphView, moved: set[str], take: str, anyway: set[str], sizes: _Sizes,
                   recomputed: Mapping[str, str]) -> float:
    """Per element: every tensor of the take or a moved node that a main-side node reads, carried once, plus
    the recomputed ops."""
    total = RECOMPUTE_OP * len(recomputed)
    for src in [take, *moved]:
        if src in recomputed:
            continue
        ports = {p for c, _, p in view.fanouts(src)
                 if p != CONTROL_PORT and ((c not in moved and c != take) or c in recomputed)}
        ports |= {int(k.rpartition(":")[2]) for k in anyway if k.rpartition(":")[0] == src}
        total += sum(sizes.carry(src, p) for p in ports)
    return total


def _reason(view: GraphView, name: str) -> str:
    reads = [f"{t.node}:{t.port}" for t in view.data_inputs(name)]
    return (f"{name!r} ({view.op(name)}) is recomputed on the main side: it costs less there than carrying its "
            f"output" + (f", from {', '.join(reads[:3])}{' ...' if len(reads) > 3 else ''}" if reads else ""))


__all__ = ["CARRY_PER_KB", "CARRY_TENSOR", "CHEAP_OPS", "CutPlan", "FILL_OPS", "METADATA_OPS", "RECOMPUTE_OP",
           "SHAPE_ARITHMETIC_OPS", "plan_cut", "recomputable"]
