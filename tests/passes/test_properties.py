"""Property tests: random DAGs with variables, feeds, random ops, control edges and a stage; the rules of
the partition and the rewrite hold on every one."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartstage.config.options import enable_smart_stage
from smartstage.graph.names import CONTROL_PORT
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import is_stateful_op
from smartstage.optimizer import optimize
from smartstage.passes.verify import verify_graph
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage

I64 = tf.int64
ON = enable_smart_stage()


@st.composite
def stage_graphs(draw):
    comps = draw(st.integers(1, 3))
    nodes = [N(f"r{i}", "Const", dtype=I64, value=[i, i + 1]) for i in range(comps)]
    nodes += fifo_stage([f"r{i}" for i in range(comps)], dtypes=[I64] * comps)
    pool = [f"stage/take:{i}" for i in range(comps)]
    for i in range(draw(st.integers(0, 2))):
        nodes += [N(f"v{i}", "VariableV2", dtype=I64, shape=[2]), N(f"v{i}/read", "Identity", [f"v{i}"], T=I64)]
        pool.append(f"v{i}/read")
    for i in range(draw(st.integers(0, 2))):
        nodes.append(N(f"p{i}", "Placeholder", dtype=I64, shape=[2]))
        pool.append(f"p{i}")
    for i in range(draw(st.integers(0, 2))):
        nodes.append(N(f"c{i}", "Const", dtype=I64, value=[3, 4]))
        pool.append(f"c{i}")
    if draw(st.booleans()):
        nodes += [N("rs", "Const", dtype=tf.int32, value=[2]), N("lo", "Const", dtype=I64, value=0),
                  N("hi", "Const", dtype=I64, value=9),
                  N("rand", "RandomUniformInt", ["rs", "lo", "hi"], T=tf.int32, Tout=I64, seed=1, seed2=2)]
        pool.append("rand")
    targets = []
    for i in range(draw(st.integers(1, 25))):
        op = draw(st.sampled_from(["AddV2", "Mul", "Identity"]))
        arity = 1 if op == "Identity" else 2
        inputs = [draw(st.sampled_from(pool)) for _ in range(arity)]
        if draw(st.integers(0, 4)) == 0:
            inputs.append("^" + draw(st.sampled_from(pool)).split(":")[0])
        nodes.append(N(f"op{i}", op, inputs, T=I64))
        pool.append(f"op{i}")
        if draw(st.integers(0, 6)) == 0:
            targets.append(f"op{i}")
    return G(*nodes), targets


def _tainted(view: GraphView) -> set[str]:
    """Nodes that depend on a variable, a feed, the take or a random op: not evaluable on both sides."""
    tainted: set[str] = set()
    for name in view.topological_order():
        if view.op(name) in ("VariableV2", "Placeholder", "QueueDequeueV2", "RandomUniformInt", "FIFOQueueV2") or any(
                src in tainted for src, _ in view.inputs(name)):
            tainted.add(name)
    return tainted


def _prefetch_and_main(view: GraphView, put: str, take: str) -> tuple[set[str], set[str]]:
    prefetch = view.ancestors([put])
    sinks = [n for n in view.names() if not view.fanouts(n) and n not in prefetch]
    main = view.ancestors(sinks, stop={take}) | {take}
    return prefetch, main


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stage_graphs())
def test_rules_hold_on_random_graphs(case):
    graph_def, targets = case
    result = optimize(graph_def, ON, targets=targets)
    new = result.graph_def
    verify_graph(new, [])  # full check: unique names, inputs resolve, acyclic
    before, after = GraphView(graph_def), GraphView(new)
    assert sorted(after.names()) == sorted(before.names()), "every node keeps its name"
    (p,) = result.partitions
    moved = set(p.moved) if p.changes_graph else set()

    prefetch_before = before.ancestors(["stage/put"])
    tainted = _tainted(before)
    for name in moved:
        assert p.pinned.get(name) is None
        node = before.node(name)
        assert node.op not in ("VariableV2", "Placeholder") and name not in targets
        for src, _ in after.inputs(name):  # a moved node reads only the prefetch side or free nodes
            assert src != "stage/take"
            assert src in moved or src in prefetch_before or src not in tainted, f"{name} reads {src}" or src in p.pinned is False

    # Pinned nodes: variables, feeds and targets, and what reads them.
    for name in before.names():
        if name.startswith("op") and (name in targets or any(
                src.startswith(("v", "p")) for src, _ in before.inputs(name))):
            assert name not in moved

    # Control edges across the cut are re-routed, never dropped.
    for name in before.names():
        for src in before.control_inputs(name):
            if src in moved and name not in moved:
                assert "stage/take" in after.input_nodes(name)
                assert src in after.control_inputs("stage/put")
            elif src == "stage/take" and name not in moved:
                assert "stage/take" in after.input_nodes(name)  # a data input from the take orders it too
            elif not (name in moved and src == "stage/take"):
                assert src in after.control_inputs(name)

    # No stateful op can run on both sides.
    prefetch, main = _prefetch_and_main(after, "stage/put", "stage/take")
    for name in prefetch & main:
        op = after.op(name)
        assert not is_stateful_op(op) or op in ("FIFOQueueV2",), f"{name} ({op}) runs on both sides"

    # The buffer carries each boundary tensor once, with its dtype.
    carried = [str(t) for t in after.data_inputs("stage/put")[1:]]
    assert len(carried) == len(set(carried))
    assert len(after.node("stage/take").attr["component_types"].list.type) == len(carried)

    # Idempotent and deterministic.
    again = optimize(new, ON, targets=targets)
    assert again.graph_def == new
    assert optimize(graph_def, ON, targets=targets).graph_def == new



@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stage_graphs(), st.randoms(use_true_random=False))
def test_node_order_of_the_input_does_not_change_the_rewrite(case, rng):
    """A GraphDef need not list nodes after their inputs: any order of the same nodes moves the same nodes
    and carries the same tensors (the buffer's component order follows the GraphDef's order); every node
    keeps its place but the put, which may move to the end."""
    graph_def, targets = case
    shuffled = graph_pb2.GraphDef()
    shuffled.node.extend(rng.sample(list(graph_def.node), len(graph_def.node)))
    expected = optimize(graph_def, ON, targets=targets)
    result = optimize(shuffled, ON, targets=targets)
    assert result.moved() == expected.moved()
    assert result.changed == expected.changed
    (p,), (q,) = result.partitions, expected.partitions
    assert sorted(p.boundary_after) == sorted(q.boundary_after)
    assert _carried_inputs(result) == _carried_inputs(expected)
    def others(g):
        return [n.name for n in g.node if n.name != "stage/put"]

    assert others(result.graph_def) == others(shuffled)
    assert optimize(result.graph_def, ON, targets=targets).graph_def == result.graph_def


def _carried_inputs(result) -> dict[str, list[str]]:
    """Each node's inputs, sorted, with a take output written as the tensor it carries ("stage/take:1" ->
    "op5:0"): the same for two rewrites that differ only in the order of the buffer's components."""
    carried = {take: tensor for tensor, take in result.fetch_map().items()}
    carried.update({t.replace(":0", ""): tensor for t, tensor in carried.items() if t.endswith(":0")})
    return {n.name: sorted(carried.get(s, s) for s in n.input) for n in result.graph_def.node}


_ = CONTROL_PORT
