"""The prefetch threads on a plain Session: counting, order, end of input, errors, shutdown, pools.

Most graphs here are
    range(n) -> [checks] -> put ~~ take -> fetched
with the range read by a one-shot iterator on the prefetch side, so every batch is a number and
losing or repeating one shows.
"""

from __future__ import annotations

import logging
import threading

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.core.protobuf import config_pb2

import smartstage.runtime as ss
from smartstage.errors import StageRuntimeError
from tests.runtime.helpers import (BOUND_SECONDS, bounded, drain, prefetch_threads_alive, range_input,
                                   wait_until)


@pytest.mark.parametrize(
    "capacity, num_threads",
    [(1, 1), (1, 3), (2, 2), (4, 1), (5, 4), (16, 2)],
)
def test_every_batch_arrives_exactly_once(graph, capacity, num_threads):
    y = ss.staged(range_input(40), capacity=capacity, num_threads=num_threads)
    with tf.compat.v1.Session(graph=graph) as sess:
        with ss.start_prefetch_threads(sess) as threads:
            got = drain(sess, y)
            # After the end of input the buffer stays closed: the next take fails at once too.
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(y, options=bounded())
            assert threads.join(timeout=BOUND_SECONDS)
        assert threads.error is None
    assert sorted(got) == list(range(40))


@settings(max_examples=10, deadline=None)
@given(n=st.integers(0, 25), capacity=st.integers(1, 5), num_threads=st.integers(1, 4))
def test_no_batch_lost_or_repeated_for_any_setting(n, capacity, num_threads):
    with tf.Graph().as_default() as graph:
        y = ss.staged(range_input(n), capacity=capacity, num_threads=num_threads)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
        got = drain(sess, y)
    assert sorted(got) == list(range(n))
    if num_threads == 1:
        assert got == list(range(n))


def test_one_thread_keeps_input_order(graph):
    y = ss.staged(range_input(50), capacity=3, num_threads=1)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
        assert drain(sess, y) == list(range(50))


def test_closed_exception_types_accept_codes(graph):
    y = ss.staged(range_input(5), closed_exception_types=(tf.errors.OUT_OF_RANGE,), num_threads=2)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
        assert sorted(drain(sess, y)) == list(range(5))


def test_ignored_errors_are_logged_and_skipped(graph, caplog):
    # range -> Assert(even) -> put: odd numbers fail on the prefetch side and are skipped.
    x = range_input(10)
    check = tf.debugging.Assert(tf.equal(x % 2, 0), ["odd record", x])
    with tf.control_dependencies([check]):
        x = tf.identity(x)
    y = ss.staged(x, ignored_exception_types=(tf.errors.InvalidArgumentError,))
    with caplog.at_level(logging.WARNING, logger="smartstage.runtime"):
        with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
            assert drain(sess, y) == [0, 2, 4, 6, 8]
    assert threads.error is None
    assert sum("ignores an error" in r.getMessage() for r in caplog.records) == 5


def _failing_input(fail_at: int) -> tf.Tensor:
    x = range_input(100)
    check = tf.debugging.Assert(x < fail_at, ["bad record at", x])
    with tf.control_dependencies([check]):
        return tf.identity(x)


def test_unexpected_error_reaches_the_main_loop_with_its_type_and_message(graph):
    y = ss.staged(_failing_input(3), capacity=1, num_threads=2)
    with tf.compat.v1.Session(graph=graph) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad record at") as caught:
            with ss.start_prefetch_threads(sess):
                drain(sess, y)   # wakes with OutOfRangeError once the threads stop on the error
    assert "stage 'stage'" in "".join(getattr(caught.value, "__notes__", []))


def test_unexpected_error_stops_the_coordinator(graph):
    y = ss.staged(_failing_input(2))
    coord = tf.train.Coordinator()
    with tf.compat.v1.Session(graph=graph) as sess:
        threads = ss.start_prefetch_threads(sess, coord=coord)
        drain(sess, y)
        wait_until(coord.should_stop, "the coordinator to stop")
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad record at"):
            coord.raise_requested_exception()
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad record at"):
            threads.raise_if_error()
        threads.stop()


def test_coordinator_stop_stops_blocked_threads(graph):
    y = ss.staged(range_input(10**6), capacity=1, num_threads=2)
    coord = tf.train.Coordinator()
    with tf.compat.v1.Session(graph=graph) as sess:
        threads = ss.start_prefetch_threads(sess, coord=coord)
        sess.run(y, options=bounded())
        coord.request_stop()
        assert threads.join(timeout=BOUND_SECONDS)
        assert threads.error is None


def test_put_waiting_past_timeout_warns_and_keeps_its_batch(graph, caplog):
    y = ss.staged(range_input(6), capacity=1, num_threads=1, timeout_millis=30)
    with caplog.at_level(logging.WARNING, logger="smartstage.runtime"):
        with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
            # Nobody takes: the buffer fills and the next put waits past its timeout.
            wait_until(lambda: any("has waited" in r.getMessage() for r in caplog.records),
                       "the timeout warning")
            got = drain(sess, y)
    assert got == list(range(6))


def test_stop_wakes_blocked_puts(graph):
    y = ss.staged(range_input(10**6), capacity=2, num_threads=3)
    with tf.compat.v1.Session(graph=graph) as sess:
        threads = ss.start_prefetch_threads(sess)
        size = sess.graph.get_tensor_by_name("stage/size:0")
        wait_until(lambda: sess.run(size) == 2, "a full buffer")
        assert threads.stop(timeout=20)
        assert prefetch_threads_alive() == []
        # After stop the buffer is cancelled: what is left drains, then the end of input.
        assert len(drain(sess, y)) <= 2


def _close_in_background(sess) -> threading.Thread:
    closer = threading.Thread(target=sess.close, name="test-closer", daemon=True)
    closer.start()
    return closer


def test_session_close_while_puts_block_is_prompt_and_leaves_no_thread(graph):
    y = ss.staged(range_input(10**6), capacity=1, num_threads=2)
    sess = tf.compat.v1.Session(graph=graph)
    threads = ss.start_prefetch_threads(sess)
    sess.run(y, options=bounded())
    size = sess.graph.get_tensor_by_name("stage/size:0")
    wait_until(lambda: sess.run(size) == 1, "a full buffer")
    closer = _close_in_background(sess)
    closer.join(BOUND_SECONDS)
    assert not closer.is_alive()
    assert threads.join(timeout=BOUND_SECONDS)
    assert threads.error is None


def test_session_close_while_main_and_prefetch_block(graph):
    # The prefetch side waits on an input queue nobody fills, so the main step waits on the take.
    source = tf.queue.FIFOQueue(4, tf.int32, shapes=[])
    y = ss.staged(source.dequeue(), num_threads=2)
    sess = tf.compat.v1.Session(graph=graph)
    threads = ss.start_prefetch_threads(sess)
    outcome = []

    def main_step():
        try:
            sess.run(y, options=bounded())
        except Exception as error:  # noqa: BLE001  recorded for the assertion below
            outcome.append(error)

    step = threading.Thread(target=main_step, name="test-main-step", daemon=True)
    step.start()
    # Best effort to close while the step waits; the assertions hold either way.
    step.join(0.3)
    closer = _close_in_background(sess)
    closer.join(BOUND_SECONDS)
    step.join(BOUND_SECONDS)
    assert not closer.is_alive() and not step.is_alive()
    assert outcome and isinstance(outcome[0], (tf.errors.CancelledError, RuntimeError))
    assert threads.join(timeout=BOUND_SECONDS)
    assert threads.error is None


def test_missing_thread_pool_fails_naming_the_stage_and_fix(graph):
    ss.staged(tf.constant(1), use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1,
              name="pooled")
    with tf.compat.v1.Session(graph=graph) as sess:
        with pytest.raises(StageRuntimeError, match=r"stage 'pooled'.*session_inter_op_thread_pool"):
            ss.start_prefetch_threads(sess)


def test_stage_runs_on_its_own_thread_pool(graph):
    y = ss.staged(range_input(20), use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1,
                  num_threads=2)
    config = tf.compat.v1.ConfigProto(session_inter_op_thread_pool=[
        config_pb2.ThreadPoolOptionProto(num_threads=0),
        config_pb2.ThreadPoolOptionProto(num_threads=1),
    ])
    with tf.compat.v1.Session(graph=graph, config=config) as sess, ss.start_prefetch_threads(sess):
        assert sorted(drain(sess, y)) == list(range(20))


def test_stages_are_chosen_by_name(graph):
    a = ss.staged(range_input(3), name="a")
    ss.staged(tf.constant(0), name="b")
    with tf.compat.v1.Session(graph=graph) as sess:
        with ss.start_prefetch_threads(sess, stages=["a"]) as threads:
            assert threads.stage_names == ["a"]
            assert drain(sess, a) == [0, 1, 2]
        with pytest.raises(StageRuntimeError, match="no stage named 'c'"):
            ss.start_prefetch_threads(sess, stages=["c"])


def test_monitored_session_is_refused(graph):
    ss.staged(tf.constant(0))
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
        with pytest.raises(StageRuntimeError, match="make_prefetch_hook"):
            ss.start_prefetch_threads(sess)


def test_restarting_on_a_cancelled_buffer_is_refused(graph):
    y = ss.staged(tf.constant(1))
    with tf.compat.v1.Session(graph=graph) as sess:
        with ss.start_prefetch_threads(sess):
            assert sess.run(y, options=bounded()) == 1
        with pytest.raises(StageRuntimeError, match="already closed"):
            ss.start_prefetch_threads(sess)


@pytest.mark.cluster
@pytest.mark.parametrize("isolate", [False, True])
def test_sessions_on_one_server_need_isolated_state(graph, isolate):
    # Server resources outlive sessions: the second session would meet the first one's closed buffer.
    server = tf.distribute.Server.create_local_server()
    y = ss.staged(tf.constant(5), capacity=2)
    config = tf.compat.v1.ConfigProto(isolate_session_state=isolate)
    with tf.compat.v1.Session(server.target, config=config) as sess, ss.start_prefetch_threads(sess):
        assert sess.run(y, options=bounded()) == 5
    with tf.compat.v1.Session(server.target, config=config) as sess:
        if isolate:
            with ss.start_prefetch_threads(sess):
                assert sess.run(y, options=bounded()) == 5
        else:
            with pytest.raises(StageRuntimeError, match="isolate_session_state=True"):
                ss.start_prefetch_threads(sess)
