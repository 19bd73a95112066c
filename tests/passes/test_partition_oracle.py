"""The partition against an independent oracle: reachability on GraphView.to_networkx().

On thousands of random staged graphs (tests.passes.test_properties' generator: variables, feeds, constants,
a random op, control edges, targets, sometimes an output of the take itself as a target), the nodes that move
are exactly those the oracle derives from the rules in plain graph terms:

    blocked  = pin sources (variables, feeds, targets) and everything reachable from them
    moved    = nodes reachable from the take, not blocked, read by something (else: "fetched directly")
             + the non-free nodes outside the take's reach that feed them (a random op of constants and
               what is computed from it only: pulled behind the stage)
    boundary = each main-side read of the take or a moved node, and every targeted take output
    (minus what the cut-cost rule recomputes on the main side: checked to be recomputable and read there only)

The oracle shares no code with the partition: networkx does the graph walks.
"""

from __future__ import annotations

import networkx as nx
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartstage.config.options import enable_smart_stage
from smartstage.graph.view import GraphView
from smartstage.optimizer import optimize
from smartstage.passes.cut_cost import recomputable
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage
from tests.passes.test_properties import stage_graphs

ON = enable_smart_stage()
PIN_OPS = {"VariableV2", "Placeholder"}
STAGE_OPS = {"FIFOQueueV2", "QueueEnqueueV2", "QueueDequeueV2"}
TAKE, PUT = "stage/take", "stage/put"


@st.composite
def staged_cases(draw):
    graph_def, targets = draw(stage_graphs())
    outputs = sum(1 for node in graph_def.node if node.name[:1] == "r" and node.name[1:].isdigit())
    choice = draw(st.integers(0, 5))
    if choice == 0:
        targets = targets + [TAKE]  # as mark_target_node records it: every output
    elif choice == 1:
        targets = targets + [f"{TAKE}:{draw(st.integers(0, outputs - 1))}"]
    return graph_def, targets


def check_against_oracle(view: GraphView, targets: list[str], moved: set[str],
                         recomputed: frozenset[str] = frozenset()) -> set[str]:
    """Asserts that `moved` follows the rules in reachability terms (networkx); returns the expected boundary.
    `recomputed`: what the cut-cost rule kept on the main side (each recomputable, every reader on the main side)."""
    graph = view.to_networkx()
    target_nodes = {t.split(":")[0] for t in targets}
    sources = {n for n, op in graph.nodes(data="op") if op in PIN_OPS} | (target_nodes - {TAKE})
    blocked = set(sources).union(*(nx.descendants(graph, s) for s in sources))
    stateful = {n for n, op in graph.nodes(data="op") if op in PIN_OPS | STAGE_OPS | {"RandomUniformInt"}}
    free = {n for n in graph if n not in stateful and not (nx.ancestors(graph, n) & stateful)}
    behind_take = nx.descendants(graph, TAKE)
    # Pulled: a random op of constants (and what is computed from it only) read from behind the take runs on
    # the prefetch side only; its readers then join the stage as if they read the take.
    pulled = moved - behind_take
    pullable = {n for n in graph if n not in free | blocked | STAGE_NODES | behind_take}
    assert pulled <= pullable, ("pulled a node that is free, pinned or a stage op", sorted(pulled - pullable))
    roots = {a for n in behind_take for a in nx.ancestors(graph, n)} & pullable
    reach = roots.union(*(nx.descendants(graph, r) for r in roots))
    assert pulled <= reach, ("pulled a node unrelated to the stage", sorted(pulled - reach))
    must_pull = {a for m in moved for a in nx.ancestors(graph, m)} & pullable
    assert must_pull <= moved, ("a moved node reads a random source left behind", sorted(must_pull - moved))
    behind = set(behind_take).union(*(nx.descendants(graph, p) for p in pulled)) - pulled - STAGE_NODES
    expected = {n for n in behind if n not in blocked and graph.out_degree(n) > 0}
    assert recomputed <= expected, ("recomputed a node that would not move", sorted(recomputed - expected))
    for name in recomputed:
        assert recomputable(view, name), name
        assert not set(graph.successors(name)) & moved, ("a recomputed node feeds the prefetch side", name)
    expected -= recomputed
    assert moved & behind == expected, ("behind the stage", sorted((moved & behind) ^ expected), targets)

    put_inputs = [f"{src}:{port}" for src, _, _, port in _data_in_edges(graph, PUT)][1:]
    boundary = set()
    for src, dst, data in graph.edges(data=True):
        if data["control"] or dst in moved or dst in STAGE_NODES or (src != TAKE and src not in moved):
            continue
        boundary.add(put_inputs[data["port"]] if src == TAKE else f"{src}:{data['port']}")
    kept = [int(t.split(":")[1]) for t in targets if t.startswith(TAKE + ":")]
    return boundary | {t for k, t in enumerate(put_inputs) if TAKE in targets or k in kept}


STAGE_NODES = {"stage/buffer", PUT, TAKE}


def _data_in_edges(graph, node):
    edges = [(src, dst, key, data["port"]) for src, dst, key, data in graph.in_edges(node, keys=True, data=True)
             if not data["control"]]
    return sorted(edges, key=lambda e: e[2])


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(staged_cases())
def test_partition_matches_the_reachability_oracle(case):
    graph_def, targets = case
    view = GraphView(graph_def)
    result = optimize(graph_def, ON, targets=targets)
    (partition,) = result.partitions
    moved = set(partition.moved)
    boundary = check_against_oracle(view, targets, moved, frozenset(partition.recomputed))
    if partition.changes_graph:
        assert set(partition.boundary_after) == boundary, targets
        # Each targeted output of the take is served by the new take output that carries it.
        mapping = result.fetch_map()
        for k, carried in enumerate(partition.take_ports):
            if TAKE in targets or f"{TAKE}:{k}" in targets:
                assert mapping[f"{TAKE}:{k}"] == f"{TAKE}:{partition.boundary_after.index(carried)}"


def test_to_networkx_has_every_node_and_input():
    #   r0 -> put ~~ take -> op0 <- ^c0        (edges: producer -> consumer, one per input)
    graph_def = G(N("r0", "Const", dtype=tf.int64, value=[1]), *fifo_stage(["r0"], dtypes=[tf.int64]),
                  N("c0", "Const", dtype=tf.int64, value=[2]),
                  N("op0", "Identity", ["stage/take:0", "^c0"], T=tf.int64))
    graph = GraphView(graph_def).to_networkx()
    assert sorted(graph) == sorted(n.name for n in graph_def.node)
    assert graph.nodes["op0"]["op"] == "Identity"
    assert dict(graph.get_edge_data("stage/take", "op0")) == {0: {"port": 0, "control": False}}
    assert dict(graph.get_edge_data("c0", "op0")) == {1: {"port": -1, "control": True}}
    assert nx.descendants(graph, "r0") == {"stage/put"}
