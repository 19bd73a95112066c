"""What staged() builds: node names and types, attrs, static shapes, the StageDef, argument checks."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage.runtime as ss
from smartstage.errors import ConfigError
from smartstage.protos.stage_pb2 import StageDef


def _nodes(graph) -> dict:
    return {op.name: op for op in graph.get_operations()}


def test_stage_ops_have_the_contract_names_and_types(graph):
    #   a, b -> stage/put ~~ stage/buffer ~~ stage/take -> (a', b')
    #   stage/ready_put ~~ stage/ready_buffer -> ready_size -> ready_check --ctrl--> stage/take
    a = tf.constant([1.0, 2.0], name="a")
    b = tf.constant("x", name="b")
    out_a, out_b = ss.staged([a, b], capacity=3)
    nodes = _nodes(graph)
    kinds = {name: nodes[f"stage/{name}"].type for name in
             ("buffer", "put", "take", "close", "cancel", "size", "ready_buffer", "ready_put", "ready_check")}
    assert kinds == {
        "buffer": "FIFOQueueV2", "put": "QueueEnqueueV2", "take": "QueueDequeueV2",
        "close": "QueueCloseV2", "cancel": "QueueCloseV2", "size": "QueueSizeV2",
        "ready_buffer": "FIFOQueueV2", "ready_put": "QueueEnqueueV2", "ready_check": "Assert",
    }
    buffer = nodes["stage/buffer"]
    assert buffer.get_attr("capacity") == 3
    assert buffer.get_attr("shared_name") == b"stage"
    assert nodes["stage/ready_buffer"].get_attr("shared_name") == b"stage/ready_buffer"
    assert nodes["stage/ready_buffer"].get_attr("capacity") == 1
    assert [s.as_list() for s in map(tf.TensorShape, buffer.get_attr("shapes"))] == [[2], []]
    assert nodes["stage/close"].get_attr("cancel_pending_enqueues") is False
    assert nodes["stage/cancel"].get_attr("cancel_pending_enqueues") is True
    assert [t.name for t in nodes["stage/put"].inputs[1:]] == ["a:0", "b:0"]
    assert nodes["stage/ready_check"] in nodes["stage/take"].control_inputs
    assert (out_a.name, out_b.name) == ("stage/take:0", "stage/take:1")
    assert out_a.shape == [2] and out_b.shape == []


def test_partly_known_shapes_leave_the_queue_unshaped_but_keep_static_shapes(graph):
    x = tf.compat.v1.placeholder_with_default(tf.zeros([4, 3]), shape=[None, 3])
    y = ss.staged({"x": x, "n": tf.constant(1)})
    assert list(graph.get_operation_by_name("stage/buffer").get_attr("shapes")) == []
    assert y["x"].shape.as_list() == [None, 3]
    assert y["n"].shape == []


def test_sparse_static_shape_survives(graph):
    sparse = tf.SparseTensor(indices=[[0, 0]], values=[1.5], dense_shape=[2, 5])
    y = ss.staged(sparse)
    assert isinstance(y, tf.SparseTensor)
    assert y.shape.as_list() == [2, 5]
    assert y.values.dtype == tf.float32


def test_stage_def_describes_the_stage(graph):
    a = tf.constant(1, name="a")
    ss.staged(
        a, capacity=4, num_threads=2, num_clients=3, timeout_millis=500,
        closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CANCELLED),
        ignored_exception_types=tf.errors.DataLossError,
        use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1,
        stage_subgraph_stream_id=2, name="input",
    )
    (stage,) = ss.stage_defs(graph)
    expected = StageDef(
        name="input", kind=StageDef.FIFO_QUEUE, buffer_node="input/buffer", put_node="input/put",
        take_node="input/take", close_node="input/close", cancel_node="input/cancel",
        size_node="input/size", ready_buffer_node="input/ready_buffer", ready_put_node="input/ready_put",
        capacity=4, num_threads=2, num_clients=3, timeout_millis=500,
        closed_error_codes=[tf.errors.OUT_OF_RANGE, tf.errors.CANCELLED],
        ignored_error_codes=[tf.errors.DATA_LOSS], use_stage_subgraph_thread_pool=True,
        stage_subgraph_thread_pool_id=1, stage_subgraph_stream_id=2, origin="staged",
        boundary_tensors=["a:0"],
    )
    assert stage == expected


def test_names_are_unique_and_follow_name_scopes(graph):
    ss.staged(tf.constant(1))
    ss.staged(tf.constant(2))
    with tf.name_scope("tower"):
        ss.staged(tf.constant(3), name="input")
    stages = ss.stage_defs(graph)
    assert [s.name for s in stages] == ["stage", "stage_1", "tower/input"]
    shared = [graph.get_operation_by_name(s.buffer_node).get_attr("shared_name") for s in stages]
    assert len(set(shared)) == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": 0}, "capacity=0"),
        ({"num_threads": 0}, "num_threads=0"),
        ({"timeout_millis": -1}, "timeout_millis=-1"),
        ({"stage_subgraph_thread_pool_id": -2}, "stage_subgraph_thread_pool_id=-2"),
        ({"use_stage_subgraph_thread_pool": "yes"}, "use_stage_subgraph_thread_pool=.yes."),
        ({"closed_exception_types": (ValueError,)}, "closed_exception_types"),
        ({"ignored_exception_types": (99,)}, "ignored_exception_types"),
        ({"closed_exception_types": (tf.errors.OutOfRangeError,),
          "ignored_exception_types": (tf.errors.OUT_OF_RANGE,)}, "both closed and ignored"),
    ],
)
def test_bad_arguments_raise_config_error(graph, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ss.staged(tf.constant(1), **kwargs)


def test_bad_features_raise_config_error(graph):
    with pytest.raises(ConfigError, match="string keys"):
        ss.staged({1: tf.constant(1)})
    with pytest.raises(ConfigError, match="no tensor"):
        ss.staged([])
    placeholder = tf.compat.v1.placeholder(tf.int32, [])
    with pytest.raises(ConfigError, match="cast the value"):
        ss.staged(placeholder, feed_dict={placeholder: tf.constant(1.0)})


def test_targets_are_recorded_once_in_marking_order(graph):
    a = tf.constant(1, name="a")
    b = tf.constant(2, name="b")
    c = tf.add(a, b, name="c")
    ss.mark_target_node([c])
    ss.mark_target_node({"x": a, "y": c.op})
    assert ss.target_node_names(graph) == ["c", "a"]
    assert graph.get_collection(ss.TARGETS_COLLECTION) == [c.op, a.op]
