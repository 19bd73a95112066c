"""Errors in order: the input fails at batch n -> batches 0..n-1 are trained, then the error, as itself.

    range(100) -> [fails at n] -> put ~~ take -> counted step

Where it fails: in the head (an Assert tied to the record, a tf.data map), or in the body (a gather
out of range: a stateless op of the moved subgraph).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage.runtime as ss
from tests.runtime.helpers import bounded, range_input

FAIL_AT = 5


def _bad_record_in_the_reader(n: int) -> tf.Tensor:
    x = range_input(100)
    check = tf.debugging.Assert(x < n, ["bad record at", x])
    with tf.control_dependencies([check]):
        return tf.identity(x)


def _failing_op_in_the_body(n: int) -> tf.Tensor:
    x = range_input(100)
    table = tf.range(n, dtype=tf.int64)          # gather(table, x) fails for x >= n
    return tf.gather(table, x, name="lookup")


def _tf_data_source(n: int) -> tf.Tensor:
    def check(x):
        tf.debugging.assert_less(x, tf.constant(n, tf.int64), message="bad record at")
        return x
    dataset = tf.data.Dataset.range(100).map(check)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


SOURCES = {"reader": _bad_record_in_the_reader, "body": _failing_op_in_the_body, "tf_data": _tf_data_source}


def _steps_until_error(sess, y, limit: int = 200) -> list[int]:
    got = []
    for _ in range(limit):
        try:
            got.append(int(sess.run(y, options=bounded())))
        except tf.errors.OutOfRangeError:
            return got
    pytest.fail("no end after the failing batch")


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize("capacity", [1, 8])
def test_plain_session_gets_every_good_batch_then_the_error(graph, source, num_threads, capacity):
    y = ss.staged(SOURCES[source](FAIL_AT), num_threads=num_threads, capacity=capacity)
    with tf.compat.v1.Session(graph=graph) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            with ss.start_prefetch_threads(sess):
                got = _steps_until_error(sess, y)
                assert got == list(range(FAIL_AT))
    assert "stage 'stage'" in "".join(getattr(caught.value, "__notes__", []))


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("num_threads", [1, 3])
def test_monitored_session_trains_exactly_the_good_batches_then_raises(graph, source, num_threads):
    y = ss.staged(SOURCES[source](FAIL_AT), num_threads=num_threads, capacity=4)
    counter = tf.compat.v1.get_variable("steps", initializer=0, use_resource=True, trainable=False)
    train = counter.assign_add(1)
    with tf.control_dependencies([train]):
        y = tf.identity(y)
    trained = []
    with pytest.raises(tf.errors.InvalidArgumentError):
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:
            while not sess.should_stop():
                trained.append(int(sess.run(y, options=bounded())))
    assert trained == list(range(FAIL_AT))


def _every_third_fails_in_the_body() -> tf.Tensor:
    x = range_input(20)
    index = tf.where(tf.equal(x % 3, 0), tf.constant(-1, tf.int64), x)
    return tf.gather(tf.range(20, dtype=tf.int64), index)   # gather(-1) fails for 0, 3, 6, ...


@pytest.mark.parametrize("num_threads", [1, 4])
def test_an_ignored_error_skips_only_its_batch_in_order(graph, num_threads):
    y = ss.staged(_every_third_fails_in_the_body(), num_threads=num_threads, capacity=2,
                  ignored_exception_types=(tf.errors.InvalidArgumentError,))
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        assert _steps_until_error(sess, y) == [x for x in range(20) if x % 3]
    assert threads.error is None
