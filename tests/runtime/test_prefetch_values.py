"""What comes out of a stage is what went in: scalars, strings, sparse tensors, lists, dicts, feeds.

The cases DeepRec's prefetch tests cover, written for this runtime: each builds a tiny graph
    const(s) -> staged(...) ~~ take -> fetched
starts the prefetch threads the way a plain-session user would (the hook's after_create_session),
and checks several batches.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage.runtime as ss
from tests.runtime.helpers import bounded


def _start(sess) -> ss.PrefetchHook:
    hook = ss.make_prefetch_hook()
    hook.after_create_session(sess, tf.train.Coordinator())
    return hook


def _sparse() -> tf.SparseTensor:
    return tf.SparseTensor(
        indices=tf.constant([[0, 0], [0, 1], [0, 2]], dtype=tf.int64),
        values=tf.constant([1, 1, 1], dtype=tf.int64),
        dense_shape=tf.constant([3, 3], dtype=tf.int64),
    )


def _assert_sparse(value, expected) -> None:
    np.testing.assert_array_equal(value.indices, expected.indices)
    np.testing.assert_array_equal(value.values, expected.values)
    np.testing.assert_array_equal(value.dense_shape, expected.dense_shape)


def test_scalar(graph):
    y = ss.staged(tf.constant(42.0), capacity=2, num_threads=2, timeout_millis=1000)
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        hook = _start(sess)
        for _ in range(6):
            assert sess.run(y, options=bounded()) == pytest.approx(42.0)
        hook.end(sess)


def test_string(graph):
    text = "'The quick brown fox jumps over the lazy dog!'"
    y = ss.staged(tf.constant(text), capacity=3, num_threads=6, timeout_millis=1000)
    assert y.dtype == tf.string and y.shape == []
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        hook = _start(sess)
        for _ in range(9):
            assert sess.run(y, options=bounded()).decode() == text
        hook.end(sess)


def test_sparse(graph):
    x = _sparse()
    y = ss.staged(x, timeout_millis=1000)
    assert isinstance(y, tf.SparseTensor)
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        expected = sess.run(x)
        hook = _start(sess)
        for _ in range(3):
            _assert_sparse(sess.run(y, options=bounded()), expected)
        hook.end(sess)


def test_list(graph):
    x1, x2 = _sparse(), tf.constant(42.0)
    y = ss.staged([x1, x2], timeout_millis=1000)
    assert isinstance(y, list) and isinstance(y[0], tf.SparseTensor)
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        expected = sess.run(x1)
        hook = _start(sess)
        for _ in range(3):
            sparse, dense = sess.run(y, options=bounded())
            _assert_sparse(sparse, expected)
            assert dense == pytest.approx(42.0)
        hook.end(sess)


def test_dict(graph):
    x1, x2 = _sparse(), tf.constant(42.0)
    y = ss.staged({"foo": x2, "bar": x1}, timeout_millis=1000)
    assert sorted(y) == ["bar", "foo"]
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        expected = sess.run(x1)
        hook = _start(sess)
        for _ in range(3):
            value = sess.run(y, options=bounded())
            _assert_sparse(value["bar"], expected)
            assert value["foo"] == pytest.approx(42.0)
        hook.end(sess)


def test_dict_fed_through_feed_dict(graph):
    x1, x2 = _sparse(), tf.constant(42.0)
    x3 = tf.compat.v1.placeholder(tf.int32, shape=[])
    x4 = tf.compat.v1.placeholder(tf.float32, shape=[2])
    feeding = tf.constant(2, dtype=tf.int32)
    y = ss.staged(
        {"foo": x2, "bar": x1, "foobar": x3, "numpy": x4},
        feed_dict={x3: feeding, x4: np.array([0.5, 1.5], dtype=np.float32)},
        timeout_millis=1000,
    )
    (stage,) = ss.stage_defs(graph)
    assert [(f.placeholder, f.tensor) for f in stage.feeds] == [
        (x3.name, feeding.name),
        (x4.name, "stage/feed_value_1:0"),
    ]
    graph.finalize()
    with tf.compat.v1.Session(graph=graph) as sess:
        expected = sess.run(x1)
        hook = _start(sess)
        for _ in range(3):
            value = sess.run(y, options=bounded())
            _assert_sparse(value["bar"], expected)
            assert value["foo"] == pytest.approx(42.0)
            assert value["foobar"] == 2
            np.testing.assert_allclose(value["numpy"], [0.5, 1.5])
        hook.end(sess)


def test_feed_values_are_read_when_each_batch_is_prefetched(graph):
    # placeholder <- read(v) on every put: a batch prefetched after v changes carries the new value.
    v = tf.compat.v1.Variable(1, dtype=tf.int32, use_resource=True)
    slot = tf.compat.v1.placeholder(tf.int32, shape=[])
    y = ss.staged(slot * 10, feed_dict={slot: v.read_value()}, capacity=1, num_threads=1)
    set_five = v.assign(5)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(v.initializer)
        with ss.start_prefetch_threads(sess):
            assert sess.run(y, options=bounded()) == 10
            sess.run(set_five)
            # At most one batch buffered and one put in flight still carry the old value.
            after = [sess.run(y, options=bounded()) for _ in range(5)]
        assert after[2:] == [50, 50, 50]
        assert set(after) <= {10, 50}


def test_numpy_and_python_features_are_converted(graph):
    y = ss.staged([np.arange(3, dtype=np.int32), 7])
    with tf.compat.v1.Session(graph=graph) as sess:
        with ss.start_prefetch_threads(sess):
            array, number = sess.run(y, options=bounded())
    np.testing.assert_array_equal(array, [0, 1, 2])
    assert number == 7
