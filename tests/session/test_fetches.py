"""Fetches and feeds that name moved nodes: the same batch as the step, or a clear error."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.session import Session
from tests.session.graphs import bounded, flag, init_ops, small_model

STEPS = 6
Pair = collections.namedtuple("Pair", "ids label")


def _plain(on: bool, steps: int = STEPS, mark=None):
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        if mark:
            ss.mark_target_node([mark(model)])
        fetches = {"loss": model.loss, "pair": Pair(model.ids, model.features["label"]),
                   "names": [model.normalized.name, model.ids.op.name + ":0"]}
        if mark:
            fetches["marked"] = mark(model)
    with Session(graph=graph, config=flag(on)) as sess:
        sess.run(init_ops(graph))
        return [sess.run([fetches, model.train_op], options=bounded())[0] for _ in range(steps)]


def _assert_same(before, after):
    assert len(before) == len(after)
    for b, a in zip(before, after):
        np.testing.assert_equal(tf.nest.flatten(b), tf.nest.flatten(a))


def test_session_fetches_of_moved_tensors_are_the_trained_batch():
    before, after = _plain(False), _plain(True)
    _assert_same(before, after)
    assert isinstance(after[0]["pair"], Pair)


def test_a_marked_target_can_be_fetched():
    before = _plain(False, mark=lambda m: m.scaled)
    after = _plain(True, mark=lambda m: m.scaled)
    _assert_same(before, after)


def test_fetch_of_a_moved_tensor_that_does_not_cross_names_it_and_the_fix():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        for fetch in (model.scaled, model.scaled.op, "scaled:0", "scaled", [{"x": model.scaled}]):
            with pytest.raises(ss.TargetError, match=r"'scaled'.*prefetch side.*mark_target_node"):
                sess.run(fetch, options=bounded())


def test_feed_of_a_moved_tensor_or_an_old_take_output_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        with pytest.raises(ss.TargetError, match=r"cannot feed 'ids:0'.*prefetch side"):
            sess.run(model.loss, feed_dict={model.ids: np.zeros([4], np.int64)}, options=bounded())
        with pytest.raises(ss.TargetError, match=r"cannot feed 'stage/take:2'"):
            sess.run(model.loss, feed_dict={model.features["label"]: np.zeros([4], np.float32)})


def test_sparse_and_callable_fetches_are_mapped():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        sparse = tf.SparseTensor(tf.constant([[0], [1], [2], [3]], tf.int64), model.ids, tf.constant([4], tf.int64))
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        value, ids = sess.run([sparse, model.ids], options=bounded())
        assert isinstance(value, tf.compat.v1.SparseTensorValue)
        np.testing.assert_array_equal(value.values, ids)
        step = sess.make_callable([model.ids, model.train_op])
        ids, _ = step()
        assert ids.shape == (4,)


class _RecordingHook(tf.compat.v1.train.SessionRunHook):
    """Asks for the hashed ids every step, through SessionRunArgs."""

    def __init__(self, tensor):
        self.tensor, self.seen = tensor, []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs({"ids": self.tensor})

    def after_run(self, run_context, run_values):
        self.seen.append(run_values.results["ids"])


def _monitored(on: bool, steps: int = STEPS):
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        hook = _RecordingHook(model.ids)
        logging_hook = tf.compat.v1.train.LoggingTensorHook({"ids": model.ids.name}, every_n_iter=1)
        values = []
        with MonitoredTrainingSession(config=flag(on), hooks=[ss.make_prefetch_hook(), hook, logging_hook]) as sess:
            while len(values) < steps:
                values.append(sess.run({"ids": model.ids, "label": model.features["label"], "loss": model.loss,
                                        "train": model.train_op}))
            from_step_fn = sess.run_step_fn(lambda step_context: step_context.run_with_hooks([model.ids, model.train_op])[0])
    return values, hook.seen, from_step_fn


def test_monitored_session_maps_user_and_hook_fetches():
    before, before_hook, before_step_fn = _monitored(False)
    after, after_hook, after_step_fn = _monitored(True)
    _assert_same(before, after)
    _assert_same(before_hook, after_hook)
    np.testing.assert_array_equal(before_step_fn, after_step_fn)
    for step, seen in zip(after, after_hook):
        np.testing.assert_array_equal(step["ids"], seen)   # the hook saw the batch the step trained on


def test_a_target_passed_to_the_session_can_be_fetched():
    values = {}
    for on in (False, True):
        graph = tf.Graph()
        with graph.as_default():
            model = small_model()
        with Session(graph=graph, config=flag(on), targets=[model.scaled]) as sess:
            sess.run(init_ops(graph))
            values[on] = [sess.run([model.scaled, model.train_op], options=bounded())[0] for _ in range(3)]
            if on:
                assert "scaled" not in sess.smart_stage.stages[0].moved
    _assert_same(values[False], values[True])
