"""The live applier: the same edit log written into a tf.Graph in place, run before and after in a session."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from smartstage.errors import GraphError
from smartstage.graph.edits import AddNode, RemoveNode, SetAttr, SetDevice, SetInputs, SetStageDef, apply_to_graph_def
from smartstage.protos import StageDef
from smartstage.runtime.stage.metadata import add_stage_def, stage_defs
from smartstage.session.live_edits import apply_to_live_graph
from tests.builder import N


def arithmetic():
    #   a=[1,2] --> b=a*2 --> c=b+1          d (NoOp)
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant([1.0, 2.0], name="a")
        b = tf.multiply(a, 2.0, name="b")
        tf.add(b, 1.0, name="c")
        tf.no_op(name="d")
    return graph


def run(graph, fetch, before=()):
    with tf.compat.v1.Session(graph=graph) as sess:
        for op in before:
            sess.run(op)
        return sess.run(fetch)


STREAM = attr_value_pb2.AttrValue(i=3)
EDITS = [AddNode(N("n", "Neg", ["a"], T=tf.float32)), SetInputs("c", ("n", "c/y", "^d")),
         SetDevice("b", "/device:CPU:0"), SetAttr("b", "_stream_id", STREAM)]


def test_each_edit_gives_the_values_and_the_nodes_of_the_graph_def_applier():
    graph = arithmetic()
    np.testing.assert_array_equal(run(graph, "c:0"), [3.0, 5.0])  # before: 2a + 1
    offline = tf.Graph()
    with offline.as_default():
        tf.graph_util.import_graph_def(apply_to_graph_def(graph.as_graph_def(), EDITS), name="")
    applied = apply_to_live_graph(graph, EDITS)
    assert applied.added == ("n",) and set(applied.edited) == {"c", "b"} and not applied.renamed
    np.testing.assert_array_equal(run(graph, "c:0"), [0.0, -1.0])  # after: -a + 1, in the same tf.Graph
    np.testing.assert_array_equal(run(offline, "c:0"), [0.0, -1.0])
    c = graph.get_operation_by_name("c")
    assert [t.name for t in c.inputs] == ["n:0", "c/y:0"] and [op.name for op in c.control_inputs] == ["d"]
    b = graph.get_operation_by_name("b")
    assert b.device == "/device:CPU:0" and b.get_attr("_stream_id") == 3


def staged_parse():
    #   s="1.5" -> put(stage/buffer: string) ~~ take -> v=to_number -> out=v*2
    graph = tf.Graph()
    with graph.as_default():
        s = tf.constant(["1.5"], name="s")
        queue = tf.raw_ops.FIFOQueueV2(component_types=[tf.string], capacity=2, shared_name="stage", name="stage/buffer")
        tf.raw_ops.QueueEnqueueV2(handle=queue, components=[s], name="stage/put")
        (taken,) = tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.string], name="stage/take")
        v = tf.strings.to_number(taken, name="v")
        tf.multiply(v, 2.0, name="out")
        add_stage_def(graph, StageDef(name="stage", buffer_node="stage/buffer", put_node="stage/put",
                                      take_node="stage/take", boundary_tensors=["s:0"]))
    return graph


def _floats():
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=[tf.float32.as_datatype_enum]))


# What expand_stage records when v moves in front of the put: the buffer carries floats now.
EXPAND = [SetInputs("v", ("s",)), SetInputs("out", ("stage/take", "out/y")),
          SetInputs("stage/put", ("stage/buffer", "v")),
          SetAttr("stage/buffer", "component_types", _floats()), SetAttr("stage/put", "Tcomponents", _floats()),
          SetAttr("stage/take", "component_types", _floats()),
          SetStageDef(StageDef(name="stage", buffer_node="stage/buffer", put_node="stage/put", take_node="stage/take",
                               boundary_tensors=["v:0"]))]


def test_a_stage_whose_dtypes_change_is_built_anew_and_gives_the_same_values():
    graph = staged_parse()
    assert run(graph, "out:0", before=["stage/put"]) == [3.0]
    applied = apply_to_live_graph(graph, EXPAND)
    (stage,) = applied.stages
    assert stage.new_ops == {"buffer": "stage/smart_stage/buffer", "put": "stage/smart_stage/put",
                             "take": "stage/smart_stage/take"}
    assert run(graph, "out:0", before=[stage.new_ops["put"]]) == [3.0]
    out = graph.get_operation_by_name("out")
    assert out.inputs[0].op.name == "stage/smart_stage/take" and out.inputs[0].dtype == tf.float32
    assert graph.get_operation_by_name("v").inputs[0].name == "s:0"
    assert graph.get_operation_by_name("stage/put").inputs[0].op.name == "stage/smart_stage/retired_buffer"
    assert graph.get_operation_by_name("stage/smart_stage/buffer").get_attr("shared_name") == b"stage/smart_stage"
    (stage_def,) = stage_defs(graph)
    assert (stage_def.put_node, stage_def.take_node, list(stage_def.boundary_tensors)) == (
        "stage/smart_stage/put", "stage/smart_stage/take", ["v:0"])


@pytest.mark.parametrize("edits, message", [
    # A live op cannot leave the graph; it is detached only when nothing left reads it (fold_dataset).
    ([SetDevice("b", "/cpu:0"), RemoveNode("a")], "the edits remove node 'a', which 'b' still reads"),
    ([SetDevice("b", "/cpu:0"), SetInputs("nowhere", ("a",))], "the session's graph has no node 'nowhere'"),
    ([SetDevice("b", "/cpu:0"), AddNode(N("a", "NoOp"))], "node 'a' is in the session's graph already"),
    ([SetDevice("b", "/cpu:0"), SetInputs("c", ("b", "^gone"))], "node 'c' would read '^gone'"),
    ([SetDevice("b", "/cpu:0"), SetAttr("b", "T", attr_value_pb2.AttrValue(type=tf.int32.as_datatype_enum))],
     "the edits change the input or output types of node 'b' (Mul)"),
], ids=["remove what is read", "unknown node", "added name taken", "missing input", "signature of a non-stage op"])
def test_an_edit_the_live_graph_cannot_take_is_refused_before_any_write(edits, message):
    graph = arithmetic()
    version = graph.version
    with pytest.raises(GraphError, match=re.escape(message)):
        apply_to_live_graph(graph, edits)
    assert graph.version == version and graph.get_operation_by_name("b").device == ""


def test_a_stage_nothing_runs_is_left_as_it_was_and_the_others_are_rewritten():
    """A hand-built queue without a StageDef or QueueRunner keeps its edges (expand_stage's edits of it are
    left out of the log); the staged() stage beside it is rebuilt, and every value is the one before."""
    from smartstage.session.session import Session
    from tests.session.graphs import bounded, flag, init_ops, small_model

    def build():
        graph = tf.Graph()
        with graph.as_default():
            model = small_model()
            queue = tf.raw_ops.FIFOQueueV2(component_types=[tf.string], capacity=2, name="hand/buffer")
            put = tf.raw_ops.QueueEnqueueV2(handle=queue, components=[tf.constant(["2.5"], name="raw")],
                                            name="hand/put")
            (taken,) = tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.string], name="hand/take")
            parsed = tf.strings.to_number(taken, name="parsed")
            loss = model.loss + tf.reduce_sum(parsed, name="hand_sum")
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, loss)
        return graph, model, put, loss

    values = {}
    for on in (False, True):
        graph, model, put, loss = build()
        with Session(graph=graph, config=flag(on)) as sess:
            sess.run(init_ops(graph))
            values[on] = []
            for _ in range(4):
                sess.run(put)
                values[on].append(sess.run([loss, model.train_op], options=bounded())[0])
            record = sess.smart_stage
    np.testing.assert_array_equal(values[False], values[True])
    assert [s.name for s in record.stages] == ["stage"]
    assert any(n.startswith("hand: left as it was in the session's graph: nothing the session knows runs its put")
               for n in record.notes), record.notes
    assert graph.get_operation_by_name("parsed").inputs[0].op.name == "hand/take"


def test_later_passes_reach_the_live_graph_through_their_logs():
    """multi_stream's `_stream_id` tags (which the old session twins never copied) land on the live ops, the
    rebuilt put included, and the steps are those of the graph without the flag."""
    from smartstage.session.session import Session
    from tests.session.graphs import bounded, flag, init_ops, lanes_flag, small_model

    losses = {}
    for on in (False, True):
        graph = tf.Graph()
        with graph.as_default():
            model = small_model()
        config = flag(False) if not on else lanes_flag(stage_multi_stream=True)  # a rebuilt put: lanes
        with Session(graph=graph, config=config) as sess:
            sess.run(init_ops(graph))
            losses[on] = [sess.run([model.loss, model.train_op], options=bounded())[0] for _ in range(5)]
    np.testing.assert_array_equal(losses[False], losses[True])
    (stage,) = sess.smart_stage.stages
    tagged = {op.name for op in graph.get_operations() if "_stream_id" in op.node_def.attr}
    assert {stage.new_ops["put"], "ids", "scaled"} <= tagged, sorted(tagged)[:8]
