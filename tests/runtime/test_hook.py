"""make_prefetch_hook() with a stock MonitoredTrainingSession: end of input, errors, re-creation."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage.runtime as ss
from tests.runtime.helpers import BOUND_SECONDS, bounded, range_input


def _train_until_done(sess, fetches, limit: int = 10000) -> list:
    got = []
    while not sess.should_stop():
        got.append(sess.run(fetches, options=bounded()))
        assert len(got) <= limit
    return got


@pytest.mark.parametrize("capacity, num_threads", [(1, 1), (3, 2)])
def test_end_of_input_ends_the_session_normally(graph, capacity, num_threads):
    y = ss.staged(range_input(30), capacity=capacity, num_threads=num_threads)
    got = []
    hook = ss.make_prefetch_hook()
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        while not sess.should_stop():
            got.append(sess.run(y, options=bounded()))   # the last step's OutOfRange ends the block
    assert sorted(got) == list(range(30))
    if num_threads == 1:
        assert got == list(range(30))
    assert hook.threads is None   # end() stopped them


def _failing_input(fail_at: int) -> tf.Tensor:
    x = range_input(1000)
    check = tf.debugging.Assert(x < fail_at, ["bad record at", x])
    with tf.control_dependencies([check]):
        return tf.identity(x)


@pytest.mark.parametrize("capacity", [1, 4])
def test_prefetch_error_reaches_the_user_as_itself(graph, capacity):
    # Not an end of input: MonitoredSession would swallow an OutOfRangeError.
    y = ss.staged(_failing_input(5), capacity=capacity, num_threads=2)
    steps = []
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad record at\] \[[56]\]"):
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:
            steps = _train_until_done(sess, y)
    assert len(steps) <= 5


def test_prefetch_error_reaches_a_loop_without_with(graph):
    y = ss.staged(_failing_input(3))
    sess = tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()])
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad record at"):
            for _ in range(1000):
                try:
                    sess.run(y, options=bounded())
                except tf.errors.OutOfRangeError:
                    # A step that was waiting when the buffer was cancelled; the next one says why.
                    continue
    finally:
        with pytest.raises(tf.errors.InvalidArgumentError):
            sess.close()   # the coordinator re-raises it on close as well


def test_missing_hook_fails_at_once_naming_the_stage_and_the_fix(graph):
    y = ss.staged(tf.constant(1.0), name="features")
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            sess.run(y, options=bounded())
    message = caught.value.message
    assert "stage 'features'" in message.replace("\\'", "'")
    assert "make_prefetch_hook()" in message


def test_missing_hook_on_a_plain_session(graph):
    y = ss.staged(tf.constant(1.0))
    with tf.compat.v1.Session(graph=graph) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="make_prefetch_hook"):
            sess.run(y, options=bounded())


class _AbortOnce(tf.compat.v1.train.SessionRunHook):
    """Raises AbortedError before step `at`, once: MonitoredTrainingSession re-creates its session."""

    def __init__(self, at: int):
        self.at, self.steps, self.sessions = at, 0, 0

    def after_create_session(self, session, coord):
        self.sessions += 1

    def before_run(self, run_context):
        self.steps += 1
        if self.steps == self.at:
            raise tf.errors.AbortedError(None, None, "preempted (test)")


def test_session_recreation_restarts_the_prefetch_threads(graph):
    text = "'The quick brown fox jumps over the lazy dog!'"
    y = ss.staged(tf.constant(text), capacity=5, num_threads=3, timeout_millis=1000)
    prefetch, abort = ss.make_prefetch_hook(), _AbortOnce(at=3)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[prefetch, abort]) as sess:
        first_threads = prefetch.threads
        for _ in range(6):
            assert sess.run(y, options=bounded()).decode() == text
        assert abort.sessions == 2
        assert prefetch.threads is not first_threads
        assert first_threads.join(timeout=BOUND_SECONDS)   # the old session's threads have ended
        assert first_threads.error is None


def test_hook_without_stages_does_nothing(graph):
    x = tf.constant(3)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:
        assert sess.run(x) == 3
