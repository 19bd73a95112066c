"""The cut-cost rule (smartstage/passes/cut_cost.py) against its straightforward reference
(tests/passes/cut_cost_reference.py) on generated graphs, and the rule's cost: each node judged once, no index of
the whole graph's readers.

    generated:  reader -> put ~~ take -> shape arithmetic, metadata ops, fills, hashes, unique, casts, concats ...
                (some with `_output_shapes`: small, batch-sized, unknown), an inner queue whose put may re-enqueue
                what its take gave (a cycle of derivations), main-side readers of a variable
    checked:    the same plan (recomputed nodes and reasons in order, worth moving, reason, both costs), the same
                smallness of every node whatever order it is asked in, the same partition of the whole graph
"""

from __future__ import annotations

import random

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2

from smartstage.graph.stages import find_stages
from smartstage.graph.view import GraphView
from smartstage.passes import cut_cost, partition
from smartstage.passes.cut_cost import _Sizes, plan_cut, recomputable
from smartstage.passes.partition import partition_stages
from tests.builder import G, N
from tests.passes import cut_cost_reference as reference
from tests.passes.stage_graphs import fifo_stage, variable
from tests.passes.test_properties import stage_graphs

I32, I64, F32, STR = tf.int32, tf.int64, tf.float32, tf.string
TAKE = "stage/take"

# op -> (number of inputs, output dtypes as a function of the first input's dtype)
OPS = {
    "Shape": 1, "Size": 1, "Identity": 1, "Reshape": 2, "ExpandDims": 2, "StridedSlice": 4, "AddV2": 2, "Cast": 1,
    "ConcatV2": 3, "Pack": 2, "Fill": 2, "BroadcastTo": 2, "ZerosLike": 1, "Range": 3, "Tile": 2,
    "StringToHashBucketFast": 1, "StringToNumber": 1, "Unique": 1, "Mul": 2,
}


def _shapes(draw, count: int):
    """An `_output_shapes` attribute: per output small, batch-sized, of an unknown dimension or unknown rank."""
    shapes = []
    for _ in range(count):
        kind = draw(st.sampled_from(["small", "big", "unknown", "rank"]))
        if kind == "rank":
            shapes.append(tensor_shape_pb2.TensorShapeProto(unknown_rank=True))
        else:
            dims = {"small": [2], "big": [100, 4], "unknown": [-1, 3]}[kind]
            shapes.append(tf.TensorShape([None if d < 0 else d for d in dims]).as_proto())
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=shapes))


def _node(name: str, op: str, inputs: list[str], dtypes: dict[str, tf.DType]) -> tuple:
    """The NodeDef and the dtypes of its outputs (attributes as TensorFlow names them)."""
    t = dtypes[inputs[0]] if inputs else I32
    attrs: dict = {}
    outputs = [t]
    if op in ("Shape", "Size"):
        attrs, outputs = dict(T=t, out_type=I32), [I32]
    elif op in ("Identity", "AddV2", "ZerosLike", "Mul"):
        attrs = dict(T=t)
    elif op == "Reshape":
        attrs = dict(T=t, Tshape=I32)
    elif op == "ExpandDims":
        attrs = dict(T=t, Tdim=I32)
    elif op == "StridedSlice":
        attrs = dict(T=t, Index=I32)
    elif op == "Cast":
        attrs, outputs = dict(SrcT=t, DstT=I64), [I64]
    elif op == "ConcatV2":
        attrs = dict(T=t, N=2, Tidx=I32)
    elif op == "Pack":
        attrs = dict(T=t, N=2)
    elif op == "Fill":
        t = dtypes[inputs[1]]
        attrs, outputs = dict(T=t, index_type=I32), [t]
    elif op == "BroadcastTo":
        attrs = dict(T=t, Tidx=I32)
    elif op == "Range":
        attrs = dict(Tidx=t)
    elif op == "Tile":
        attrs = dict(T=t, Tmultiples=I32)
    elif op == "StringToHashBucketFast":
        attrs, outputs = dict(num_buckets=10), [I64]
    elif op == "StringToNumber":
        attrs, outputs = dict(out_type=F32), [F32]
    elif op == "Unique":
        attrs, outputs = dict(T=t, out_idx=I32), [t, I32]
    return N(name, op, inputs, **attrs), outputs


@st.composite
def cut_graphs(draw):
    """A staged graph of random ops behind the take (and an inner queue), main-side readers of a variable, and
    targets. Returns (graph_def, targets, op names)."""
    nodes = [N("r0", "Const", dtype=STR, value=[b"a", b"b"]), N("r1", "Const", dtype=I64, value=[1, 2]),
             N("r2", "Const", dtype=I64, value=list(range(100))),
             *fifo_stage(["r0", "r1", "r2"], dtypes=[STR, I64, I64]),
             N("c_scalar", "Const", dtype=I32, value=1), N("c_pair", "Const", dtype=I32, value=[2, 3]),
             N("c_big", "Const", dtype=I32, value=list(range(80))), *variable("w"),
             N("q/buffer", "FIFOQueueV2", component_types=[I32], shapes=[], capacity=2),
             N("q/take", "QueueDequeueV2", ["q/buffer"], component_types=[I32])]
    dtypes = {f"{TAKE}:0": STR, f"{TAKE}:1": I64, f"{TAKE}:2": I64, "c_scalar": I32, "c_pair": I32,
              "c_big": I32, "w/read": F32, "q/take": I32}
    pool = [f"{TAKE}:0", f"{TAKE}:1", f"{TAKE}:2", "c_scalar", "c_pair", "c_big", "q/take"]
    names = []
    for i in range(draw(st.integers(1, 18))):
        op = draw(st.sampled_from(sorted(OPS)))
        inputs = [draw(st.sampled_from(pool)) for _ in range(OPS[op])]
        if op == "Mul":
            inputs[1] = "w/read"  # the main side: it reads a variable
        name = f"n{i}"
        node, outputs = _node(name, op, inputs, dtypes)
        if draw(st.integers(0, 3)) == 0:
            node.attr["_output_shapes"].CopyFrom(_shapes(draw, len(outputs)))
        if draw(st.integers(0, 6)) == 0:
            node.input.append("^" + draw(st.sampled_from(pool)).split(":")[0])
        nodes.append(node)
        names.append(name)
        for k, dtype in enumerate(outputs):
            tensor = name if k == 0 else f"{name}:{k}"
            dtypes[tensor] = dtype
            pool.append(tensor)
    # the inner queue re-enqueues one of them: q/take:0 is judged as that tensor (a cycle when derived from it)
    nodes.append(N("q/put", "QueueEnqueueV2", ["q/buffer", draw(st.sampled_from(pool))], Tcomponents=[I32]))
    for k in range(draw(st.integers(0, 3))):
        read = draw(st.sampled_from(pool))
        nodes.append(N(f"main{k}", "Mul", [read, "w/read"], T=F32))
        names.append(f"main{k}")
    targets = [n for n in names if draw(st.integers(0, 5)) == 0]
    return G(*nodes), targets, names


def _compare_plans(view: GraphView, moved: list[str], fixed: list[str], anyway: list[str]) -> None:
    got = plan_cut(view, moved, TAKE, fixed=fixed, crossing_anyway=anyway)
    want = reference.plan_cut(view, moved, TAKE, fixed=fixed, crossing_anyway=anyway)
    assert list(got.recomputed.items()) == list(want["recomputed"].items())
    assert (got.worth_moving, got.reason) == (want["worth_moving"], want["reason"])
    assert (got.cost_before, got.cost_after) == (want["cost_before"], want["cost_after"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_graphs(), st.randoms(use_true_random=False))
def test_the_plan_is_the_reference_plan_on_any_moved_set(case, rng):
    graph_def, _, names = case
    view = GraphView(graph_def)
    moved = [n for n in names if rng.random() < 0.7]
    fixed = [n for n in moved if rng.random() < 0.15]
    anyway = [f"{TAKE}:{k}" for k in range(3) if rng.random() < 0.3]
    _compare_plans(view, moved, fixed, anyway)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_graphs(), st.randoms(use_true_random=False))
def test_smallness_and_recomputability_do_not_depend_on_the_order_they_are_asked_in(case, rng):
    graph_def, _, _ = case
    view = GraphView(graph_def)
    names = list(view.names())
    want = reference.Sizes(view)
    expected = {n: want.small(n) for n in names}  # the reference in graph order
    for order in (names, names[::-1], rng.sample(names, len(names))):
        sizes = _Sizes(view)
        assert {n: sizes.small(n) for n in order} == expected
    sizes = _Sizes(view)
    for name in rng.sample(names, len(names)):
        assert recomputable(view, name, sizes) == reference.recomputable(view, name, reference.Sizes(view)), name


def _reference_plan(view, moved, take, *, fixed=(), crossing_anyway=(), fanouts=None):
    plan = reference.plan_cut(view, moved, take, fixed=fixed, crossing_anyway=crossing_anyway)
    return cut_cost.CutPlan(recomputed=plan["recomputed"], worth_moving=plan["worth_moving"], reason=plan["reason"])


def _fields(p):
    return (p, p.take_readers, p.main_readers)


def _shuffle(graph_def) -> None:
    """The graph's nodes in another written order (a fixed one per size, so a failure replays)."""
    nodes = list(graph_def.node)
    random.Random(len(nodes)).shuffle(nodes)
    del graph_def.node[:]
    graph_def.node.extend(nodes)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_graphs(), st.booleans())
def test_the_partition_is_the_one_the_reference_plan_gives(monkeypatch_case, shuffled):
    graph_def, targets, _ = monkeypatch_case
    if shuffled:  # out of written order: the partition's readers come in another order than the graph's
        _shuffle(graph_def)
    view = GraphView(graph_def)
    stages, _ = find_stages(view)
    got = partition_stages(view, stages, set(targets), set())
    original = partition.plan_cut
    partition.plan_cut = _reference_plan
    try:
        view = GraphView(graph_def)
        stages, _ = find_stages(view)
        want = partition_stages(view, stages, set(targets), set())
    finally:
        partition.plan_cut = original
    assert [_fields(p) for p in got] == [_fields(p) for p in want]


# -- the cost of the rule -------------------------------------------------------------------------------------------

def feature_graph(features: int):
    """`features` copies of: take:f -> ids (hash) -> lookup(w) -> loss; ids -> shape -> strided_slice (of constant
    begin/end/strides) -> main-side reshape of the lookup; ids -> size -> expand -> concat -> reshape."""
    nodes = [N(f"r{f}", "Const", dtype=STR, value=[b"a"]) for f in range(features)]
    nodes += fifo_stage([f"r{f}" for f in range(features)]) + variable("w")
    for f in range(features):
        p = f"f{f}/"
        take = TAKE if f == 0 else f"{TAKE}:{f}"
        nodes += [N(p + "ids", "StringToHashBucketFast", [take], num_buckets=10),
                  N(p + "axis", "Const", dtype=I32, value=0),
                  N(p + "lookup", "GatherV2", ["w/read", p + "ids", p + "axis"], Tparams=F32, Tindices=I64, Taxis=I32),
                  N(p + "shape", "Shape", [p + "ids"], T=I64, out_type=I32),
                  *(N(p + c, "Const", dtype=I32, value=[v]) for c, v in (("begin", 0), ("end", 1), ("strides", 1))),
                  N(p + "first", "StridedSlice", [p + "shape", p + "begin", p + "end", p + "strides"],
                    T=I32, Index=I32),
                  N(p + "size", "Size", [p + "ids"], T=I64, out_type=I32),
                  N(p + "expand", "ExpandDims", [p + "size", p + "axis"], T=I32, Tdim=I32),
                  N(p + "tail", "Const", dtype=I32, value=[4]),
                  N(p + "concat", "ConcatV2", [p + "expand", p + "tail", p + "axis"], T=I32, N=2, Tidx=I32),
                  N(p + "flat", "Reshape", [p + "lookup", p + "concat"], T=F32, Tshape=I32),
                  N(p + "row", "Reshape", [p + "flat", p + "first"], T=F32, Tshape=I32),
                  N(p + "loss", "Sum", [p + "row", p + "axis"], T=F32, Tidx=I32)]
    return G(*nodes)


def test_each_node_is_judged_once_and_no_index_of_every_reader_is_built(monkeypatch):
    view = GraphView(feature_graph(200))
    judged: dict[str, int] = {}
    judge = _Sizes._judge

    def counting(self, name):
        judged[name] = judged.get(name, 0) + 1
        return judge(self, name)

    monkeypatch.setattr(_Sizes, "_judge", counting)
    stages, _ = find_stages(view)
    (p,) = partition_stages(view, stages, set(), set())
    assert len(p.recomputed) == 200 * 5  # shape, first, size, expand, concat of every feature
    assert judged and max(judged.values()) == 1
    assert view._fanouts is None  # the partition's sweep gave the readers: no index of the whole graph's


@pytest.mark.parametrize("features", [50, 400])
def test_the_plan_is_the_reference_plan_on_many_features(features):
    view = GraphView(feature_graph(features))
    stages, _ = find_stages(view)
    (p,) = partition_stages(view, stages, set(), set())
    _compare_plans(view, list(p.moved) + list(p.recomputed), [], [])


class _CheckedReaders(partition._Readers):
    """The partition's readers, each list checked against the view's index of every node's readers."""

    def __call__(self, name):
        got = super().__call__(name)
        assert list(got) == list(self._view.fanouts(name)), name
        return got


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stage_graphs(), st.booleans())
def test_the_readers_the_sweep_saw_are_the_views_readers(case, shuffled):
    # random graphs with variables, feeds, a random op pulled behind the stage, control edges and targets
    graph_def, targets = case
    if shuffled:
        _shuffle(graph_def)
    view = GraphView(graph_def)
    stages, _ = find_stages(view)
    original = partition._Readers
    partition._Readers = _CheckedReaders
    try:
        partition_stages(view, stages, set(targets), set())
    finally:
        partition._Readers = original


@st.composite
def flow_networks(draw):
    """Random networks over S, T and up to 12 nodes: edges with integer capacities or infinite (None); the
    infinite ones never leave S (so the maximum flow is finite, as in the rule's networks)."""
    keys = ["S", "T", *range(draw(st.integers(1, 12)))]
    edges = []
    for _ in range(draw(st.integers(1, 40))):
        u, v = draw(st.sampled_from(keys)), draw(st.sampled_from(keys))
        if u == "T" or v == "S" or u == v:
            continue
        capacity = draw(st.one_of(st.none(), st.integers(1, 50))) if u != "S" else draw(st.integers(1, 50))
        edges.append((u, v, capacity))
    return edges


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow_networks())
def test_the_sink_side_is_networkx_s(edges):
    import networkx as nx

    from smartstage.passes.min_cut import FlowNetwork

    net, graph = FlowNetwork(), nx.DiGraph()
    graph.add_nodes_from(["S", "T"])
    for u, v, capacity in edges:
        net.add_edge(u, v, capacity)
        if capacity is None:
            graph.add_edge(u, v)
        else:
            graph.add_edge(u, v, capacity=capacity)
    residual = nx.algorithms.flow.preflow_push(graph, "S", "T")
    want, todo = {"T"}, ["T"]
    while todo:
        v = todo.pop()
        for u in residual.predecessors(v):
            if u not in want and residual[u][v]["capacity"] - residual[u][v]["flow"] > 0:
                want.add(u)
                todo.append(u)
    assert net.sink_side() == want
