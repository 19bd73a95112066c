"""Order at every thread count: each step sees the batch the unstaged graph sees, value for value.

The graph (built twice, with and without the stage; same graph-level seed):

    range(n) -> GetNext -> x --+-> cost(x): a sum over a range whose length varies with x --+-> put ~~ take
    random_uniform ------------+                                                             |
                                                  take -> loss(w) -> SGD step on w  <--------+

The cost of the body varies per batch, so lanes running concurrently finish out of order; the random op
(head) and the training variable make any reordering show in every later loss.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss_top
import smartstage.runtime as ss
from smartstage.runtime.lanes.lanes import autotune_max_threads
from smartstage.runtime.lanes.tuning.autotune import AUTOTUNE_HARD_CAPACITY
from tests.runtime.helpers import BOUND_SECONDS, bounded, drain, range_input, wait_until

STEPS = 30


def _model(staged_kwargs: dict | None, n: int = STEPS):
    tf.compat.v1.set_random_seed(7)
    x = range_input(n)
    noise = tf.random.uniform([], seed=3)
    length = (x * 7919) % 23 * 4000   # 0 .. 88000 elements: cheap and costly batches mixed
    cost = tf.reduce_sum(tf.sqrt(tf.cast(tf.range(length), tf.float32) + 1.0))
    features = [tf.cast(x, tf.float32) + noise, cost * 1e-6]
    if staged_kwargs is not None:
        features = ss.staged(features, **staged_kwargs)
    w = tf.compat.v1.get_variable("w", initializer=0.5, use_resource=True)
    loss = tf.square(w * features[0] - features[1])
    step = tf.compat.v1.train.GradientDescentOptimizer(0.001).minimize(loss)
    return [loss, features[0], features[1]], step, w


def _run(staged_kwargs: dict | None, n: int = STEPS, lanes_ready: bool = False):
    """Every step's values (last: the trained variable) and the stage's stats. lanes_ready: the steps start
    once every lane but worker 0 has its executors (while they build, worker 0 puts: on a fast machine it can
    put every batch before they are ready, and no lane would produce)."""
    with tf.Graph().as_default() as graph:
        fetches, step, w = _model(staged_kwargs, n)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if staged_kwargs is None:
                return drain(sess, [fetches, step]) + [[[sess.run(w)], None]], None
            with ss.start_prefetch_threads(sess) as threads:
                if lanes_ready:
                    producer = threads._stages[0].producer  # noqa: SLF001
                    wait_until(lambda: all(producer._ready[1:]), "the lanes' executors")  # noqa: SLF001
                got = drain(sess, [fetches, step]) + [[[sess.run(w)], None]]   # last: the trained variable
                stats = threads.stats()[0]
    return got, stats


@functools.lru_cache(maxsize=2)
def _unstaged(n: int = STEPS):
    return _run(None, n)[0]


def _assert_identical(got, want) -> None:
    assert len(got) == len(want)
    for index, ((values, _), (expected, _)) in enumerate(zip(got, want)):
        for value, exp in zip(values, expected):
            np.testing.assert_array_equal(value, exp, err_msg=f"step {index}")


@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize("capacity", [1, 4, 40])
def test_every_step_is_identical_to_the_unstaged_graph(num_threads, capacity):
    # more batches than the buffer holds, so the lanes produce once ready (worker 0 fills the buffer first)
    n = STEPS if num_threads == 1 else capacity + STEPS
    got, stats = _run({"num_threads": num_threads, "capacity": capacity}, n, lanes_ready=True)
    _assert_identical(got, _unstaged(n))
    assert stats.ordered and stats.num_threads == num_threads
    if num_threads > 1:
        # Not vacuous: the lanes really produced batches side by side.
        assert sum(1 for n in stats.lane_batches if n) >= 2, stats.lane_batches


def test_autotune_defaults_are_identical_too():
    got, stats = _run({})
    _assert_identical(got, _unstaged())
    # The tuner decided for this stage, within its bounds: the lanes built for AUTOTUNE, its hard capacity.
    decision = stats.decision
    assert stats.ordered and decision.stage == stats.stage, decision
    assert 1 <= decision.num_threads <= autotune_max_threads(), decision
    assert 1 <= decision.capacity <= AUTOTUNE_HARD_CAPACITY, decision


def test_the_unordered_opt_out_delivers_every_batch_once():
    # deterministic=False: four producers run the whole put at once; order is not promised, the
    # multiset of batches is (the random op then pairs with other batches: compare x only).
    got, stats = _run({"num_threads": 4, "capacity": 4, "deterministic": False})
    assert not stats.ordered
    steps = got[:-1]   # the last entry is the trained variable
    xs = sorted(int(values[1] // 1) for values, _ in steps)
    assert xs == list(range(STEPS))


def test_the_opt_out_is_recorded_in_the_stage_def(graph):
    ss.staged(tf.constant(1), deterministic=False, name="a")
    ss.staged(tf.constant(1), name="b")
    assert [d.unordered for d in ss.stage_defs(graph)] == [True, False]
    assert [(d.num_threads, d.capacity) for d in ss.stage_defs(graph)][1] == (ss.AUTOTUNE, ss.AUTOTUNE)
    assert ss_top.AUTOTUNE == ss.AUTOTUNE == -1


@pytest.mark.parametrize("num_threads", [2, 4])
def test_end_of_input_delivers_each_batch_once_in_order(graph, num_threads):
    y = ss.staged(range_input(37), capacity=3, num_threads=num_threads)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        assert drain(sess, y) == list(range(37))
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(y, options=bounded())
        assert threads.join(timeout=BOUND_SECONDS)
    assert threads.error is None


def test_a_feed_dict_reaches_head_and_body(graph):
    slot = tf.compat.v1.placeholder(tf.int64, shape=[])
    y = ss.staged(range_input(12) * slot, feed_dict={slot: np.int64(3)}, num_threads=3, capacity=2)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
        assert drain(sess, y) == [3 * i for i in range(12)]


def test_a_finalized_graph_without_lanes_runs_one_ordered_thread(graph, caplog):
    y = ss.staged(range_input(15), num_threads=3, capacity=2)
    graph.finalize()
    with caplog.at_level("WARNING", logger="smartstage.runtime"):
        with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
            assert drain(sess, y) == list(range(15))
    assert threads.stats()[0].num_threads == 1
    assert any("graph is finalized" in r.getMessage() for r in caplog.records)


def test_the_prefetch_hook_builds_lanes_before_the_graph_is_finalized(graph):
    y = ss.staged(range_input(20), num_threads=2, capacity=2)
    hook = ss.make_prefetch_hook()
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        got = [sess.run(y, options=bounded())]
        producer = hook.threads._stages[0].producer  # noqa: SLF001
        wait_until(lambda: producer._ready[1], "lane 1's executors")  # noqa: SLF001  (worker 0 puts meanwhile)
        while not sess.should_stop():
            got.append(sess.run(y, options=bounded()))
            stats = hook.threads.stats()[0]
    assert got == list(range(20))
    assert stats.num_threads == 2 and all(stats.lane_batches)
