"""explain: why a node stays on the main side (the chain from the pin's cause) or why it moved."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.errors import GraphError, NoStageError, TargetError
from smartstage.inspection.explain import explain
from tests.builder import G, N
from tests.inspection.graphs import deeprec_example, no_stage_graph, tiny_graph

ON = ss.enable_smart_stage()


@pytest.fixture(scope="module")
def tiny():
    graph = tiny_graph()
    return graph, ss.optimize(graph, ON)


def test_pinned_node_chain_from_the_cause(tiny):
    graph, result = tiny
    e = explain(graph, "total", result=result)
    assert (e.verdict, e.kind, e.cause, e.stage) == ("pinned", "variable", "w", "q")
    assert e.chain == ("w", "w/read", "lookup", "loss", "total")
    assert e.reason == "'total' stays on the main side of stage 'q': it reads variable 'w' through 'loss', 'lookup', 'w/read'"
    assert e.text().splitlines()[1] == "  chain: w -> w/read -> lookup -> loss -> total"


def test_pinned_in_the_deeprec_example(tmp_path):
    e = explain(deeprec_example(tmp_path), "embedding_lookup")
    assert e.verdict == "pinned"
    assert e.reason.endswith("it reads variable 'var' through 'var/read'")
    assert e.chain == ("var", "var/read", "embedding_lookup")


def test_moved_node(tiny):
    graph, result = tiny
    e = explain(graph, "as_number", result=result)
    assert (e.verdict, e.stage) == ("moved", "q")
    assert e.chain == ("take", "upper", "as_number")
    assert "moved to the prefetch side of stage 'q'" in e.reason
    assert "now reads as_number:0 through the take" in e.reason
    inner = explain(graph, "upper", result=result)
    assert inner.verdict == "moved" and "only other moved nodes consume it" in inner.reason


def test_a_tensor_name_names_its_node(tiny):
    graph, result = tiny
    assert explain(graph, "hash:0", result=result).node == "hash"


def test_a_port_the_node_does_not_have_is_refused_as_optimize_refuses_a_target(tiny):
    # The same check as optimize(targets=["loss:7"]): 'hash:7' is not silently read as 'hash'.
    graph, result = tiny
    with pytest.raises(TargetError) as error:
        explain(graph, "hash:7", result=result)
    assert str(error.value) == ("explain NODE 'hash:7': node 'hash' (StringToHashBucketFast) has 1 output(s) "
                                "(hash:0), no output 7; name one of them or the node itself")
    with pytest.raises(TargetError, match=r"target 'hash:7': node 'hash' \(StringToHashBucketFast\) has 1 output"):
        ss.optimize(graph, ON, targets=["hash:7"])
    assert explain(graph, "hash:0", result=result).verdict == explain(graph, "hash", result=result).verdict


@pytest.mark.parametrize("name, verdict, words", [
    ("reader", "prefetch", "on the prefetch side of stage 'q' already"),
    ("axis", "free", "computed from constants only"),
    ("put", "stage_op", "is the put of stage 'q'"),
    ("q", "stage_op", "is the buffer of stage 'q'"),
    ("w", "main", "it would stay anyway: reads variable 'w'"),
])
def test_nodes_that_never_cross(tiny, name, verdict, words):
    graph, result = tiny
    e = explain(graph, name, result=result)
    assert e.verdict == verdict and words in e.reason


def test_fed_value_pins_with_a_sentence_about_the_cause():
    #   reader -> put ~~ take -> add(scale) -> out        scale is a Placeholder fed by the step
    graph = G(
        N("reader", "Placeholder", dtype=tf.float32),
        N("q", "FIFOQueueV2", component_types=[tf.float32], shapes=[], capacity=2, shared_name="q"),
        N("put", "QueueEnqueueV2", ["q", "reader"], Tcomponents=[tf.float32]),
        N("take", "QueueDequeueV2", ["q"], component_types=[tf.float32]),
        N("scale", "Placeholder", dtype=tf.float32),
        N("add", "AddV2", ["take", "scale"], T=tf.float32),
        N("out", "Neg", ["add"], T=tf.float32),
    )
    e = explain(graph, "out")
    assert e.verdict == "pinned" and e.kind == "feed" and e.chain == ("scale", "add", "out")
    assert e.reason == ("'out' stays on the main side of stage 'q': it depends on 'scale' through 'add', "
                        "and 'scale' is fed (Placeholder)")


def test_missing_node_names_the_closest(tiny):
    graph, result = tiny
    with pytest.raises(GraphError, match=r"no node named 'lokup'; did you mean 'lookup'"):
        explain(graph, "lokup", result=result)
    with pytest.raises(GraphError, match="no node named 'nothing/like/it'"):
        explain(graph, "nothing/like/it", result=result)


def test_no_stage():
    with pytest.raises(NoStageError):
        explain(no_stage_graph(), "y")
