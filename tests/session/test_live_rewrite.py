"""The rewrite of the live graph: the same handles, new boundary ops, done once per graph."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.live_rewrite import NEW_SCOPE, live_rewrite_of
from smartstage.session import Session
from tests.session.graphs import bounded, flag, init_ops, small_model


def _train(graph, model, steps, on, fetch=None):
    fetch = fetch or (lambda m: m.loss)
    with Session(graph=graph, config=flag(on)) as sess:
        sess.run(init_ops(graph))
        return [sess.run([fetch(model), model.train_op], options=bounded())[0] for _ in range(steps)]


def test_flag_on_rewrites_in_place_and_the_step_is_identical():
    off_graph, on_graph = tf.Graph(), tf.Graph()
    with off_graph.as_default():
        off_model = small_model()
    with on_graph.as_default():
        on_model = small_model()
    before = _train(off_graph, off_model, 10, on=False)
    after = _train(on_graph, on_model, 10, on=True)
    np.testing.assert_array_equal(before, after)
    assert live_rewrite_of(off_graph) is None
    record = live_rewrite_of(on_graph)
    (stage,) = record.stages
    assert {"ids", "scaled", "normalized"} <= set(stage.moved)
    assert stage.new_ops["take"] == f"stage/{NEW_SCOPE}/take"


def test_the_stage_def_names_the_new_ops_and_the_old_put_is_never_run():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        old_size = graph.get_tensor_by_name("stage/size:0")
    with Session(graph=graph, config=flag()) as sess:
        (stage_def,) = ss.stage_defs(graph)
        assert stage_def.put_node == f"stage/{NEW_SCOPE}/put"
        assert stage_def.take_node == f"stage/{NEW_SCOPE}/take"
        assert "ids:0" in stage_def.boundary_tensors
        sess.run(init_ops(graph))
        for _ in range(3):
            sess.run(model.train_op, options=bounded())
        # The old buffer is never filled: read its size with the stock run (no mapping).
        assert tf.compat.v1.Session.run(sess, old_size) == 0
        # Through the SmartStage session the old size op means the new one.
        assert sess.run(old_size) >= 0


def test_a_second_session_on_the_same_graph_does_not_rewrite_again():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph, config=flag()) as first:
        record = first.smart_stage
        version = graph.version
    with Session(graph=graph, config=flag()) as second:
        assert second.smart_stage is record
        assert graph.version == version
        second.run(init_ops(graph))
        second.run(model.train_op, options=bounded())
    # A session without the flag on a rewritten graph still maps fetches through the record.
    with Session(graph=graph) as third:
        third.run(init_ops(graph))
        assert third.smart_stage is record
        third.run([model.ids, model.train_op], options=bounded())


def test_control_edge_across_the_cut_still_guards_every_step():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model(guard=True)
    with Session(graph=graph, config=flag()) as sess:
        (stage,) = sess.smart_stage.stages
        assert "ids_in_range" in stage.moved
        loss_op = graph.get_operation_by_name("guarded_loss")
        assert graph.get_operation_by_name(stage.new_ops["take"]) in loss_op.control_inputs
        put = graph.get_operation_by_name(stage.new_ops["put"])
        assert graph.get_operation_by_name("ids_in_range") in put.control_inputs
        sess.run(init_ops(graph))
        sess.run(model.train_op, options=bounded())


def test_devices_of_the_old_boundary_are_kept():
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/cpu:0"):
            model = small_model()
    with Session(graph=graph, config=flag()) as sess:
        (stage,) = sess.smart_stage.stages
        for role in ("buffer", "put", "take"):
            assert "CPU:0" in graph.get_operation_by_name(stage.new_ops[role]).device.upper()
        sess.run(init_ops(graph))
        sess.run(model.train_op, options=bounded())


def test_a_finalized_graph_is_rewritten_and_finalized_again():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        init = init_ops(graph)
    graph.finalize()
    with Session(graph=graph, config=flag()) as sess:
        assert sess.smart_stage.changed
        assert graph.finalized
        sess.run(init)
        sess.run(model.train_op, options=bounded())


def test_ops_built_after_the_session_read_the_new_take():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph, config=flag()) as sess:
        with graph.as_default():
            label_mean = tf.reduce_mean(model.features["label"])   # reads an old take output
            ids_max = tf.reduce_max(model.ids)                      # reads a moved tensor that crosses
            late_scaled = tf.reduce_sum(model.scaled)                # reads one that does not cross
        sess.run(init_ops(graph))
        mean, top, labels, ids = sess.run([label_mean, ids_max, model.features["label"], model.ids],
                                          options=bounded())
        assert mean == pytest.approx(np.mean(labels)) and top == np.max(ids)
        with pytest.raises(ss.TargetError, match="scaled"):
            sess.run(late_scaled, options=bounded())
