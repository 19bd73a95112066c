"""The cut-cost rule (smartstage/passes/cut_cost.py) on small hand-drawn stages: what it recomputes on the main
side, what it must leave moved, when nothing is worth moving, and a brute-force oracle over every allowed choice.

    take -> hash -> lookup(w) -> flat       hash:0 crosses (lookup reads it)
              \\-> shape(hash) ---/          before: shape:0 crosses too    after: shape recomputed from hash:0
"""

from __future__ import annotations

import itertools

import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartstage.config.options import enable_smart_stage
from smartstage.graph.stages import find_stages
from smartstage.optimizer import optimize
from smartstage.graph.view import GraphView
from smartstage.passes.cut_cost import _boundary_cost, _Sizes, recomputable
from smartstage.passes.partition import partition_stages
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage, gather, reader, variable

I32, I64, F32 = tf.int32, tf.int64, tf.float32


def partition(graph_def, targets=()):
    view = GraphView(graph_def)
    stages, _ = find_stages(view)
    (p,) = partition_stages(view, stages, set(targets), set())
    return p


def shape_of_crossing_ids():
    #   take -> hash -----------> lookup(w) -> flat -> loss
    #              \-> shape ----------------/            (Reshape(lookup, shape): shape of the ids)
    return G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
             *variable("w"), *gather("lookup", "w/read", "hash"),
             N("shape", "Shape", ["hash"], T=I64, out_type=I32),
             N("flat", "Reshape", ["lookup", "shape"], T=F32, Tshape=I32),
             N("loss", "Sum", ["flat", "lookup/axis"], T=F32, Tidx=I32))


def test_shape_of_a_tensor_that_crosses_anyway_is_recomputed():
    p = partition(shape_of_crossing_ids())
    assert p.moved == ("hash",)
    assert p.recomputed == ("shape",)
    assert p.pinned["shape"].kind == "recompute" and "recomputed on the main side" in p.pinned["shape"].detail
    assert p.boundary_after == ("hash:0",)  # before the rule: ("hash:0", "shape:0")
    assert not p.skipped


def shape_of_a_tensor_that_stays_behind():
    #   take -> dense(StringToNumber) -> scaled -> loss(w)     dense:0 does not cross
    #                  \-> shape ---------------> flat(w)     shape:0 crosses: cheaper than carrying dense:0
    return G(reader("r"), *fifo_stage(["r"]), N("dense", "StringToNumber", ["stage/take"], out_type=F32),
             N("two", "Const", dtype=F32, value=2.0), N("scaled", "Mul", ["dense", "two"], T=F32),
             N("shape", "Shape", ["dense"], T=F32, out_type=I32), *variable("w"),
             N("flat", "Reshape", ["w/read", "shape"], T=F32, Tshape=I32),
             N("loss", "AddV2", ["flat", "scaled"], T=F32))


def test_shape_of_a_tensor_that_does_not_cross_stays_moved():
    p = partition(shape_of_a_tensor_that_stays_behind())
    assert set(p.moved) == {"dense", "scaled", "shape"}
    assert p.recomputed == ()
    assert set(p.boundary_after) == {"scaled:0", "shape:0"}


def gradient_shape_chain():
    #   take -> ids(hash) ------------------------------> lookup(w) -> loss
    #               \-> size -> expand -> concat(const) -> grad_shape(Reshape of w by it) -/
    return G(reader("r"), *fifo_stage(["r"]), N("ids", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
             *variable("w"), *gather("lookup", "w/read", "ids"),
             N("size", "Size", ["ids"], T=I64, out_type=I32), N("dim0", "Const", dtype=I32, value=0),
             N("expand", "ExpandDims", ["size", "dim0"], T=I32, Tdim=I32),
             N("tail", "Const", dtype=I32, value=[4]), N("axis", "Const", dtype=I32, value=0),
             N("concat", "ConcatV2", ["expand", "tail", "axis"], T=I32, N=2, Tidx=I32),
             N("grad_shape", "Reshape", ["lookup", "concat"], T=F32, Tshape=I32),
             N("loss", "Sum", ["grad_shape", "axis"], T=F32, Tidx=I32))


def test_a_chain_of_shape_arithmetic_is_recomputed_whole():
    p = partition(gradient_shape_chain())
    assert set(p.recomputed) == {"size", "expand", "concat"}  # each alone would swap one tensor for another
    assert p.moved == ("ids",) and p.boundary_after == ("ids:0",)


def test_a_shape_op_a_moved_op_still_reads_stays_moved():
    #   take -> ids -> lookup(w);  ids -> size -> main (Fill);  size -> scaled(Cast, moved: work on a batch)
    g = G(reader("r"), *fifo_stage(["r"]), N("ids", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          *variable("w"), *gather("lookup", "w/read", "ids"), N("size", "Size", ["ids"], T=I64, out_type=I32),
          N("range", "Range", ["lookup/axis", "size", "one"], Tidx=I32), N("one", "Const", dtype=I32, value=1),
          N("scaled", "Cast", ["range"], SrcT=I32, DstT=F32),
          N("main", "Fill", ["size", "w_scalar"], T=F32, index_type=I32),
          N("w_scalar", "Sum", ["w/read", "lookup/axis"], T=F32, Tidx=I32),
          N("loss", "AddV2", ["main", "scaled"], T=F32))
    p = partition(g)
    assert "size" in p.moved and "size" not in p.recomputed  # range (moved, not shape-sized) reads it
    assert "size:0" in p.boundary_after


def test_a_stage_that_moves_shape_arithmetic_only_stays_as_it_was():
    #   take -> shape -> flat(w)     (nothing but a Shape would move)
    g = G(reader("r"), *fifo_stage(["r"]), N("shape", "Shape", ["stage/take"], T=tf.string, out_type=I32),
          *variable("w"), N("flat", "Reshape", ["w/read", "shape"], T=F32, Tshape=I32))
    p = partition(g, targets=["flat"])
    assert not p.changes_graph
    assert p.skipped.startswith("nothing worth moving: the moved part is shape arithmetic only (Shape)")


def test_strings_are_never_shape_arithmetic():
    #   take:0 (strings) -> concat(const strings) -> out     (a string concat of two elements is no shape)
    g = G(reader("r"), *fifo_stage(["r"]), N("xxx", "Const", dtype=tf.string, value=[b"xxx"]),
          N("axis", "Const", dtype=I32, value=0),
          N("concat", "ConcatV2", ["stage/take", "xxx", "axis"], T=tf.string, N=2, Tidx=I32))
    assert not recomputable(GraphView(g), "concat")
    assert recomputable(GraphView(g), "axis") is False  # a Const is free, never a candidate


# -- oracle: every allowed choice of recomputed nodes, costed the same way --------------------------------------
CHEAP = ("Shape", "Size", "Identity", "ExpandDims")


@st.composite
def cheap_stages(draw):
    """take -> hash -> a few cheap ops (each reads the hash or an earlier one), read by the main side or not."""
    count = draw(st.integers(1, 6))
    nodes = [reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
             *variable("w"), N("dim0", "Const", dtype=I32, value=0)]
    names, main_reads = ["hash"], []
    for i in range(count):
        src = draw(st.sampled_from(names))
        op = draw(st.sampled_from(CHEAP))
        dtype = I64 if src == "hash" or (src.startswith("c") and names and _dtype_of(nodes, src) == I64) else I32
        name = f"c{i}"
        if op in ("Shape", "Size"):
            nodes.append(N(name, op, [src], T=dtype, out_type=I32))
        elif op == "Identity":
            nodes.append(N(name, op, [src], T=dtype))
        else:
            nodes.append(N(name, op, [src, "dim0"], T=dtype, Tdim=I32))
        names.append(name)
        if draw(st.booleans()):
            main_reads.append(name)
    if draw(st.booleans()):
        main_reads.append("hash")
    for k, name in enumerate(main_reads or ["hash"]):
        nodes.append(N(f"m{k}", "Cast", [name], SrcT=_dtype_of(nodes, name), DstT=F32))
        nodes.append(N(f"use{k}", "AddV2", [f"m{k}", "w/read"], T=F32))
    return G(*nodes)


def _dtype_of(nodes, name):
    node = next(n for n in nodes if n.name == name)
    if node.op in ("Shape", "Size"):
        return I32
    if node.op == "StringToHashBucketFast":
        return I64
    return tf.as_dtype(node.attr["T"].type)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cheap_stages())
def test_the_plan_is_the_cheapest_allowed_choice(graph_def):
    view = GraphView(graph_def)
    stages, _ = find_stages(view)
    (p,) = partition_stages(view, stages, set(), set())
    moved = set(p.moved) | set(p.recomputed)
    sizes = _Sizes(view)
    candidates = [n for n in sorted(moved) if recomputable(view, n, sizes)]
    best = None
    for r in range(len(candidates) + 1):
        for chosen in itertools.combinations(candidates, r):
            chosen = set(chosen)
            # allowed: every reader of a recomputed node is on the main side (not moved, or recomputed)
            if any(f.consumer in moved and f.consumer not in chosen for n in chosen for f in view.fanouts(n)):
                continue
            cost = _boundary_cost(view, moved, "stage/take", set(), sizes, dict.fromkeys(chosen, ""))
            best = cost if best is None else min(best, cost)
    got = _boundary_cost(view, moved, "stage/take", set(), sizes, dict.fromkeys(p.recomputed, ""))
    assert abs(got - best) < 1e-9, (p.recomputed, got, best)
    for name in p.recomputed:  # a recomputed node feeds the main side only
        assert all(f.consumer not in p.moved for f in view.fanouts(name))


def test_a_long_chain_of_shape_arithmetic_is_judged_without_recursion():
    #   take -> ids -> shape -> id0 -> id1 -> ... -> id2999      (deeper than Python's recursion limit)
    nodes = [reader("r"), *fifo_stage(["r"]), N("ids", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
             N("shape", "Shape", ["ids"], T=I64, out_type=I32)]
    nodes += [N(f"id{i}", "Identity", ["shape" if i == 0 else f"id{i - 1}"], T=I32) for i in range(3000)]
    view = GraphView(G(*nodes))
    assert _Sizes(view).small("id2999")
    assert not _Sizes(view).small("ids")  # a batch of ids of unknown size


def default_weights_of_a_batch():
    #   take -> dense(StringToNumber) --------------------------> pred(w) -> loss
    #              \-> shape -> ones(BroadcastTo(1.0, shape)) -/            (loss = Sum(pred * ones))
    #   dense:0 crosses anyway; ones is a batch-sized fill of a scalar: recomputed from shape on the main side
    return G(reader("r"), *fifo_stage(["r"]), N("dense", "StringToNumber", ["stage/take"], out_type=F32),
             N("shape", "Shape", ["dense"], T=F32, out_type=I32), N("one", "Const", dtype=F32, value=1.0),
             N("ones", "BroadcastTo", ["one", "shape"], T=F32, Tidx=I32), *variable("w"),
             N("pred", "Mul", ["dense", "w/read"], T=F32), N("weighted", "Mul", ["pred", "ones"], T=F32),
             N("axis", "Const", dtype=I32, value=0), N("loss", "Sum", ["weighted", "axis"], T=F32, Tidx=I32))


def test_a_fill_of_a_scalar_to_the_batch_shape_is_recomputed():
    p = partition(default_weights_of_a_batch())
    assert p.moved == ("dense",)
    assert set(p.recomputed) == {"shape", "ones"}
    assert p.boundary_after == ("dense:0",)  # before the rule: ("dense:0", "ones:0")


def test_a_fill_of_a_batch_sized_value_is_not_recomputable():
    g = default_weights_of_a_batch()
    ones = next(n for n in g.node if n.name == "ones")
    ones.input[0] = "dense"  # BroadcastTo(dense, shape): the value is the batch itself
    assert recomputable(GraphView(g), "ones") is False


def shape_arithmetic_behind_the_take():
    #   r0 (100 elements: a batch) -> put ~~ take; c0 (2 elements)
    #   op1 = c0 + c0 (^take) -> op2 = c0 + op1 -> op11 = take + op2 (target)
    #                        \-> op9 = take + op1 -> op10 = take + op9 (target); op4 = take + op1 (target)
    #   op0, op3, op5..op8: take + take (targets, some ^take)
    # The first run moves op1 and op9 and recomputes op2 (small arithmetic) on the main side from op1:0, which
    # then crosses; the second run finds op2 reading the take: the take's output is judged as what the put
    # enqueues (small), so op2 is recomputed again and the graph stays as it is.
    t, ctl, small = "stage/take:0", "^stage/take", dict(T=I64)
    ops = {"op0": [t, t, ctl], "op1": ["c0", "c0", ctl], "op2": ["c0", "op1"], "op3": [t, t, ctl],
           "op4": [t, "op1"], "op5": [t, t, ctl], "op6": [t, t], "op7": [t, t, ctl], "op8": [t, t],
           "op9": [t, "op1"], "op10": [t, "op9"], "op11": [t, "op2"]}
    return G(N("r0", "Const", dtype=I64, value=list(range(100))), *fifo_stage(["r0"], dtypes=[I64]),  # a batch
             N("c0", "Const", dtype=I64, value=[3, 4]), *(N(name, "AddV2", inputs, **small) for name, inputs in ops.items()))


def test_the_rule_gives_the_same_cut_when_run_on_its_own_output():
    targets = ["op0", "op3", "op4", "op5", "op6", "op7", "op8", "op10", "op11"]
    first = optimize(shape_arithmetic_behind_the_take(), enable_smart_stage(), targets=targets)
    assert first.partitions[0].moved == ("op1", "op9") and first.partitions[0].recomputed == ("op2",)
    again = optimize(first.graph_def, enable_smart_stage(), targets=targets)
    assert again.graph_def == first.graph_def
