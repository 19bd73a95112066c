"""AUTOTUNE: lanes and capacity chosen from measurements, within the byte cap; explicit values kept.

Workloads whose best lane count is known:
    latency-bound body (a stateless py_func sleeping 30 ms per batch), cheap step, 8 inter-op threads
                                                                                    -> the most lanes
    cheap body, step that sleeps 30 ms                                               -> one lane
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

import smartstage.runtime as ss
from smartstage.runtime.lanes.tuning.autotune import Tuner
from smartstage.runtime.lanes.tuning.meter import Window
from smartstage.runtime.lanes.lanes import autotune_max_threads
from tests.runtime.helpers import bounded, range_input


def _sleepy(seconds: float):
    def body(x):
        time.sleep(seconds)   # releases the GIL: lanes overlap like a remote read would
        return x
    return body


def _train(sess, y, steps: int, step_sleep: float = 0.0) -> list[int]:
    got = []
    for _ in range(steps):
        got.append(int(sess.run(y, options=bounded())))
        if step_sleep:
            time.sleep(step_sleep)
    return got


def test_a_latency_bound_body_gets_the_most_lanes(graph):
    x = range_input(10**6)
    body = tf.numpy_function(_sleepy(0.03), [x], tf.int64, stateful=False)   # PyFuncStateless: the body
    y = ss.staged(body)
    # A sleeping op holds an inter-op thread: with the default pool (one per core) two sleeps overlap
    # at most, and 2 lanes are best (the tuner finds that too); with 8 threads (this session's own; the
    # global pool is sized once per process) the most lanes are.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8, use_per_session_threads=True)
    with tf.compat.v1.Session(graph=graph, config=config) as sess, ss.start_prefetch_threads(sess) as threads:
        got = _train(sess, y, 700)
        (decision,) = threads.decisions()
    assert got == list(range(700))   # in order throughout the tuning
    assert decision.settled, decision
    assert decision.num_threads == autotune_max_threads(), decision


def test_a_buffer_filling_ahead_of_an_idle_step_is_not_read_as_training_bound(graph):
    # staged(x, capacity=60), lanes AUTOTUNE: before the first step (a restore, the train op's first run
    # building its executors) the one lane fills the buffer while nothing takes from it. Those windows
    # show a filled buffer, but say nothing of which side sets the pace: judged, they settled one lane
    # for good (the pace at one lane then matched the settled one, so the search never re-opened).
    x = range_input(10**6)
    body = tf.numpy_function(_sleepy(0.03), [x], tf.int64, stateful=False)
    y = ss.staged(body, capacity=60)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8, use_per_session_threads=True)
    with tf.compat.v1.Session(graph=graph, config=config) as sess, ss.start_prefetch_threads(sess) as threads:
        assert int(sess.run(y, options=bounded())) == 0   # the producer runs from here
        time.sleep(2.2)                                    # the step idles: ~60 batches fill the buffer
        got = [0] + _train(sess, y, 800)
        (decision,) = threads.decisions()
    assert got == list(range(801))
    assert decision.settled and decision.num_threads > 1, decision


def test_a_training_bound_step_keeps_one_lane(graph):
    y = ss.staged(range_input(10**6) * 2)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        got = _train(sess, y, 60, step_sleep=0.03)
        (decision,) = threads.decisions()
        (stats,) = threads.stats()
    assert got == [2 * i for i in range(60)]
    assert decision.settled and decision.num_threads == 1, decision
    assert "step" in decision.reason
    assert stats.occupancy > 1


def test_the_byte_cap_bounds_what_is_buffered(graph):
    # 1000 float32 = 4000 bytes a batch; a cap of 9000 bytes allows 2 batches.
    x = tf.cast(range_input(10**6), tf.float32) + tf.zeros([1000])
    y = ss.staged(x, max_buffered_bytes=9000)
    size = graph.get_tensor_by_name("stage/size:0")
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        seen = []
        for step in range(40):
            value = sess.run(y, options=bounded())
            assert value[0] == step
            time.sleep(0.01)   # a slow step: the producer runs ahead as far as it may
            seen.append(int(sess.run(size)))
        (stats,) = threads.stats()
    assert max(seen) <= 2, seen
    assert stats.capacity <= 2 and stats.batch_bytes == 4000


def test_explicit_values_are_kept_as_given(graph):
    x = range_input(10**6)
    body = tf.numpy_function(_sleepy(0.005), [x], tf.int64, stateful=False)
    y = ss.staged(body, num_threads=3, capacity=5)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        assert _train(sess, y, 120) == list(range(120))
        (stats,) = threads.stats()
    assert (stats.num_threads, stats.capacity) == (3, 5)
    assert stats.decision.reason.startswith("explicit settings") and stats.decision.tried == ()
    assert "session has one inter-op pool" in stats.decision.reason   # a plain Session: the pool is not tried
    assert not stats.own_pool and stats.decision.pool_tried == ()


def _window(batches: int, empty: int) -> Window:
    return Window(started=0.0, batches=batches, empty=empty)


def test_the_tuner_goes_back_when_a_lane_more_does_not_pay():
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    assert not tuner.observe(_window(30, 30), 50.0, 100)        # first window: still the start-up
    assert tuner.observe(_window(30, 30), 50.0, 100) and tuner.num_threads == 2
    assert not tuner.observe(_window(30, 30), 90.0, 100)        # the window right after a change
    assert tuner.observe(_window(30, 30), 95.0, 100) and tuner.num_threads == 3
    tuner.observe(_window(30, 30), 95.0, 100)
    assert tuner.observe(_window(30, 30), 96.0, 100)            # 3 lanes: +1%, the buffer still empty ...
    assert tuner.num_threads == 4 and not tuner.settled            # ... so 4 are tried against 2
    tuner.observe(_window(30, 30), 96.0, 100)
    changed = tuner.observe(_window(30, 30), 97.0, 100)         # 4 lanes: no gain over 2 either
    assert changed and tuner.num_threads == 2 and tuner.settled
    assert [t[0] for t in tuner.tried] == [1, 2, 3, 4]


def test_a_lane_that_costs_throughput_ends_the_search_at_once():
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 30), 50.0, 100)
    assert tuner.observe(_window(30, 30), 50.0, 100) and tuner.num_threads == 2
    tuner.observe(_window(30, 30), 48.0, 100)
    assert tuner.observe(_window(30, 30), 48.0, 100)            # 2 lanes ran slower than 1: no leap
    assert tuner.num_threads == 1 and tuner.settled


def test_a_gentle_slope_is_climbed_two_lanes_at_a_time():
    # Past 2 lanes each lane buys ~5%, under the 6% margin: judged one lane at a time the search stopped at 2.
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 30), 50.0, 100)
    assert tuner.observe(_window(30, 30), 50.0, 100) and tuner.num_threads == 2
    tuner.observe(_window(30, 30), 60.0, 100)
    assert tuner.observe(_window(30, 30), 60.0, 100) and tuner.num_threads == 3   # +20%: kept, one more
    tuner.observe(_window(30, 30), 63.0, 100)
    assert tuner.observe(_window(30, 30), 63.0, 100) and tuner.num_threads == 4   # +5%: on to 4, judged against 2
    assert "a gain under 6%" in tuner.reason
    tuner.observe(_window(30, 30), 66.0, 100)
    tuner.observe(_window(30, 30), 66.0, 100)                                 # +10% over 2: 4 lanes kept
    assert tuner.num_threads == 4 and tuner.settled, tuner.reason


def test_a_window_in_which_the_buffer_filled_is_not_judged():
    tuner = Tuner("s", 1, 2, True, True, max_threads=4, max_buffered_bytes=10**9)
    assert not tuner.observe(_window(30, 0), 50.0, 100)                      # start-up window
    filling = Window(started=0.0, batches=30, empty=0, first=1, last=30)   # the step took nothing
    assert not tuner.observe(filling, 50.0, 100)
    assert not tuner.settled and tuner.tried == []
    taking = Window(started=0.0, batches=30, empty=30, first=1, last=1)    # the step took every batch
    assert tuner.observe(taking, 50.0, 100) and tuner.num_threads == 2


def test_the_tuner_reopens_when_throughput_moves():
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 0), 50.0, 100)
    tuner.observe(_window(30, 0), 50.0, 100)                    # buffer full: settle at one lane
    assert tuner.settled and tuner.num_threads == 1
    tuner.observe(_window(30, 0), 50.0, 100)
    assert not tuner.observe(_window(30, 0), 52.0, 100)          # noise: nothing changes
    assert not tuner.observe(_window(30, 30), 20.0, 100)         # one odd window: still noise
    assert not tuner.observe(_window(30, 30), 20.0, 100) and tuner.settled
    assert tuner.observe(_window(30, 30), 20.0, 100)             # the third in a row: measure again
    assert not tuner.settled and tuner.num_threads == 1


def test_the_tuner_keeps_the_fewest_lanes_that_keep_the_buffer_filled():
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 30), 40.0, 100)                   # start-up window
    assert tuner.observe(_window(30, 30), 40.0, 100) and tuner.num_threads == 2   # warm-up: empty, one lane more
    tuner.observe(_window(30, 0), 90.0, 100)
    assert tuner.observe(_window(30, 0), 90.0, 100) and tuner.num_threads == 1    # filled: try one lane less
    tuner.observe(_window(30, 0), 90.0, 100)
    assert not tuner.observe(_window(30, 0), 90.0, 100)         # one lane keeps it filled: settle there
    assert tuner.settled and tuner.num_threads == 1


def test_the_tuner_goes_back_when_one_lane_less_runs_empty():
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 30), 40.0, 100)
    assert tuner.observe(_window(30, 30), 40.0, 100) and tuner.num_threads == 2
    tuner.observe(_window(30, 0), 90.0, 100)
    assert tuner.observe(_window(30, 0), 90.0, 100) and tuner.num_threads == 1
    tuner.observe(_window(30, 30), 45.0, 100)
    assert tuner.observe(_window(30, 30), 45.0, 100)            # one lane runs empty: back to two
    assert tuner.settled and tuner.num_threads == 2 and "1 lanes let the buffer run empty" in tuner.reason


def test_a_full_buffer_at_a_new_pace_does_not_reopen_the_search():
    """Pauses of the step (evaluation, checkpoints) and a slower step change the rate, not the input."""
    tuner = Tuner("s", 1, 2, tune_num_threads=True, tune_capacity=False, max_threads=4, max_buffered_bytes=10**9)
    tuner.observe(_window(30, 0), 50.0, 100)
    tuner.observe(_window(30, 0), 50.0, 100)
    tuner.observe(_window(30, 0), 50.0, 100)
    assert tuner.settled
    for rate in (5.0, 5.0, 5.0, 200.0, 200.0, 200.0):              # full buffer: the step's pace
        assert not tuner.observe(_window(30, 0), rate, 100)
    assert tuner.settled and tuner.num_threads == 1


def test_byte_cap_arithmetic():
    tuner = Tuner("s", 1, 8, tune_num_threads=False, tune_capacity=True, max_threads=1, max_buffered_bytes=10_000)
    assert tuner.capacity_limit(4000) == 2 and tuner.capacity_limit(20_000) == 1
    assert tuner.cap_capacity(4000) and tuner.capacity == 2
    np.testing.assert_equal(tuner.decision().capacity, 2)
