"""The rewrite of the live graph: the same handles, new boundary ops, done once per graph."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.live_rewrite import NEW_SCOPE
from smartstage.session.record import live_rewrite_of
from smartstage.session.session import Session
from tests.bounds import HANG_SECONDS
from tests.session.graphs import bounded, init_ops, small_model
from tests.session.graphs import lanes_flag as flag  # the rebuilt buffer (lanes), not the fold: test_fold_session.py


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
    off = live_rewrite_of(off_graph)
    assert off is None or all(s.folded_into for s in off.stages)  # flag off: folded at most
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


def queue_runner_model():
    """
        range -> batch -> enqueue ~~ FIFOQueue ~~ dequeue -> * 3 (moves) -> matmul(w) -> loss -> train
    A hand-made stage (no StageDef), filled by a QueueRunner: the rewrite swaps the runner's ops.
    """
    x = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.range(1000).map(lambda i: tf.cast(tf.fill([2], i), tf.float32)).batch(4)).get_next()
    queue = tf.queue.FIFOQueue(2, [tf.float32], shapes=[[4, 2]], shared_name="hand_made")
    enqueue = queue.enqueue([x])
    tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [enqueue]))
    tripled = queue.dequeue() * 3.0
    w = tf.compat.v1.get_variable("w", [2, 1], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_sum(tf.matmul(tripled, w))
    return tf.compat.v1.train.GradientDescentOptimizer(0.001).minimize(loss), loss


def train_queue_runner_model(on: bool):
    graph = tf.Graph()
    with graph.as_default():
        train_op, loss = queue_runner_model()
    with Session(graph=graph, config=flag(on)) as sess:
        sess.run(init_ops(graph))
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
        try:
            losses = [sess.run([loss, train_op], options=bounded())[0] for _ in range(4)]
        finally:
            coord.request_stop()
            sess.run(graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)[0].cancel_op)
            coord.join(threads, stop_grace_period_secs=HANG_SECONDS)
    (runner,) = graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
    return losses, runner, sess.smart_stage


def test_a_queue_runner_stage_runs_the_new_put():
    before, _, _ = train_queue_runner_model(False)
    after, runner, record = train_queue_runner_model(True)
    (stage,) = record.stages
    assert [op.name for op in runner.enqueue_ops] == [stage.new_ops["put"]]
    assert runner.close_op.name == stage.new_ops["close"] and runner.cancel_op.name == stage.new_ops["cancel"]
    np.testing.assert_array_equal(before, after)
    assert before[0] == 6 * (0 + 1 + 2 + 3)   # batch 0 holds 0..3, tripled, two columns, w = 1


def test_an_export_of_the_rewritten_graph_has_one_stage_and_runs_the_same():
    """What a checkpoint's .meta holds: the new stage only (the old put is retired), and the same values."""
    from smartstage.inspection.replay import run_steps

    exports = {}
    for on in (False, True):
        graph = tf.Graph()
        with graph.as_default():
            model = small_model()
        with Session(graph=graph, config=flag(on)):
            exports[on] = tf.compat.v1.train.export_meta_graph(graph=graph)
    again = ss.optimize(exports[True], ss.enable_smart_stage())
    assert [p.stage.put for p in again.partitions] == [f"stage/{NEW_SCOPE}/put"]
    assert not again.changed, "optimizing the rewritten graph again changes nothing"
    before = run_steps(exports[False], [model.loss.name], steps=6)
    after = run_steps(exports[True], [model.loss.name], steps=6)
    np.testing.assert_array_equal(before.values, after.values)
