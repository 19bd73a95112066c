"""Misuse gets clear errors, never a hang; the end of input and prefetch errors reach the caller."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.session import Session
from tests.session.graphs import bounded, dataset_features, flag, init_ops, lanes_flag, small_model


def unstaged_model():
    """dataset -> hash -> embed(w) -> loss -> train: preprocessing, but no stage to grow."""
    f = dataset_features()
    ids = tf.strings.to_hash_bucket_fast(f["cat"], 50)
    w = tf.compat.v1.get_variable("w", [50, 1])
    loss = tf.reduce_mean(tf.nn.embedding_lookup(w, ids))
    return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)


def test_flag_without_a_stage_says_how_to_add_one():
    graph = tf.Graph()
    with graph.as_default():
        unstaged_model()
        with pytest.raises(ss.NoStageError, match=r"no stage boundary.*smartstage\.staged"):
            MonitoredTrainingSession(config=flag())
    with pytest.raises(ss.NoStageError, match=r"smartstage\.staged"):
        Session(graph=graph, config=flag())


@pytest.mark.parametrize("on", [True, False], ids=["flag", "no flag"])
def test_monitored_session_without_the_prefetch_hook_fails_at_creation(on):
    with tf.Graph().as_default() as graph:
        small_model()
        with pytest.raises(ss.StageRuntimeError, match=r"stage\(s\) \['stage'\].*make_prefetch_hook"):
            MonitoredTrainingSession(config=flag(on))
        with pytest.raises(ss.StageRuntimeError, match="chief_only_hooks"):
            MonitoredTrainingSession(is_chief=False, chief_only_hooks=[ss.make_prefetch_hook()], max_wait_secs=1)
    assert ss.live_rewrite_of(graph) is None, "nothing rewritten before the error"


def test_a_rewritten_stage_without_prefetch_threads_fails_the_step_instead_of_hanging():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    flag = lanes_flag  # a stage with a buffer (lanes): a folded stage needs no threads at all
    with Session(graph=graph, config=flag(), prefetch=False) as sess:
        assert sess.smart_stage.changed
        sess.run(init_ops(graph))
        with pytest.raises(tf.errors.InvalidArgumentError, match="make_prefetch_hook"):
            sess.run(model.train_op, options=bounded())
    # prefetch=False: the caller starts them, as with a stock session.
    with Session(graph=graph, config=flag(), prefetch=False) as sess:
        sess.run(init_ops(graph))
        with ss.start_prefetch_threads(sess):
            sess.run(model.train_op, options=bounded())
    # prefetch=True (the default) starts them on the first step: a second set is refused, not started.
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        with pytest.raises(ss.StageRuntimeError, match=r"starts the prefetch threads itself.*prefetch=False"):
            ss.start_prefetch_threads(sess)
        sess.run(model.train_op, options=bounded())


def test_a_target_that_names_no_node():
    graph = tf.Graph()
    with graph.as_default():
        small_model()
        with pytest.raises(ss.TargetError, match="'no_such_node' names no node"):
            MonitoredTrainingSession(config=flag(), hooks=[ss.make_prefetch_hook()], targets=["no_such_node:0"])
    with pytest.raises(ss.TargetError, match="names no node"):
        Session(graph=graph, config=flag(), targets=["no_such_node"])


def test_the_end_of_input_reaches_the_plain_session_as_out_of_range():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model(num_epochs=1)
    steps = 0
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        with pytest.raises(tf.errors.OutOfRangeError):
            for _ in range(100):
                sess.run(model.train_op, options=bounded())
                steps += 1
    assert steps == 16  # 64 rows, batches of 4


def failing_model():
    """
        range(100) -> batch(4) -> stage -> x -> Assert(max(x) < 8) ....> (control) loss -> train
                                            \\-> cast -> * w -> loss
    The Assert moves to the prefetch side (its control edge to the loss is re-routed through the
    put and the take), so its failure on the third batch happens in a prefetch thread.
    """
    x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(100).batch(4)).get_next()
    x = ss.staged(x, num_threads=1)
    check = tf.raw_ops.Assert(condition=tf.reduce_max(x) < 8, data=[tf.constant("batch beyond 8")], name="small")
    w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
    with tf.control_dependencies([check]):
        loss = tf.reduce_sum(tf.cast(x, tf.float32) * w)
    return tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)


def test_a_prefetch_error_reaches_run_as_that_error():
    graph = tf.Graph()
    with graph.as_default():
        train_op = failing_model()
    flag = lanes_flag  # the prefetch threads' error (a folded stage's check fails the step through its iterator)
    with Session(graph=graph, config=flag()) as sess:
        assert "small" in sess.smart_stage.stages[0].moved
        sess.run(init_ops(graph))
        with pytest.raises(tf.errors.InvalidArgumentError, match="batch beyond 8"):
            for _ in range(10):
                sess.run(train_op, options=bounded())
        assert isinstance(sess.prefetch_threads.error, tf.errors.InvalidArgumentError)


def test_a_prefetch_error_reaches_the_monitored_session_as_that_error():
    with tf.Graph().as_default():
        train_op = failing_model()
        with pytest.raises(tf.errors.InvalidArgumentError, match="batch beyond 8"):
            with MonitoredTrainingSession(config=flag(), hooks=[ss.make_prefetch_hook()]) as sess:
                for _ in range(10):
                    sess.run(train_op)


def test_fetches_of_the_unoptimized_graph_need_no_mapping():
    """Flag off: the plain session is a stock session plus prefetch threads."""
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph) as sess:
        assert sess.smart_stage is None or all(s.folded_into for s in sess.smart_stage.stages)  # only folded
        sess.run(init_ops(graph))
        ids, _ = sess.run([model.ids, model.train_op], options=bounded())
        assert ids.dtype == np.int64
