"""The producer's runs through callables (runtime/lanes/producers/callables.py): same values as run(), made once per fetch list."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage.runtime as ss
from smartstage.runtime.lanes.producers.callables import ProducerRuns
from tests.runtime.helpers import STEP_MILLIS, drain, range_input, wait_until

OPTIONS = config_pb2.RunOptions(timeout_in_ms=STEP_MILLIS)


def test_runs_give_what_run_gives_and_make_one_callable_per_fetch_list(graph):
    queue = tf.queue.FIFOQueue(4, [tf.int64], shapes=[[]])
    x = tf.compat.v1.placeholder_with_default(tf.constant(5, tf.int64), [])
    put = queue.enqueue([x * 2])
    with tf.control_dependencies([put]):  # the size after this run's put (one run, no race)
        size = queue.size()
    with tf.compat.v1.Session(graph=graph) as sess:
        runs = ProducerRuns(sess)
        assert runs.run([put, size], OPTIONS) == [None, 1]  # what sess.run([put, size]) gives
        assert runs.run([put, size], OPTIONS) == [None, 2]
        assert runs.prepare([put, size], OPTIONS) is runs.prepare([put, size], OPTIONS)
        assert runs.run([put, size], OPTIONS, feed={x: np.int64(1)}) == [None, 3]  # a feed: through run()
        assert sorted(int(v) for v in sess.run(queue.dequeue_many(3))) == [2, 10, 10]
    with pytest.raises(RuntimeError, match="closed Session"):
        runs.run([size], OPTIONS)


def test_a_session_that_cannot_make_callables_runs_through_run(graph):
    class Wrapper:  # what a MonitoredSession hands over: a run() without the Session class
        def __init__(self, sess):
            self.sess = sess

        def run(self, *args, **kwargs):
            return self.sess.run(*args, **kwargs)

    value = tf.constant(3)
    with tf.compat.v1.Session(graph=graph) as sess:
        runs = ProducerRuns(Wrapper(sess))
        assert runs.prepare([value], OPTIONS) is None and runs.run([value], OPTIONS) == [3]


def test_a_lane_is_warmed_when_it_first_becomes_active_and_not_before(graph):
    """AUTOTUNE builds 4 lanes and starts on one: worker 0 runs the put (through run(): its executors serve
    every pool) and no lane builds anything. When 3 lanes may run, lanes 1 and 2 make their move's callable
    before their first ticket, then worker 0 its own; the head's run (one fetch list for every lane) and each
    lane's fed body run are built on their first batch, through run(). Every fetch list is built once, lane 3
    never builds or runs, and every batch arrives in order."""
    y = ss.staged(tf.identity(range_input(10**6) * 3, name="body"))
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        assert [int(sess.run(y)) for _ in range(10)] == [3 * i for i in range(10)]
        producer = threads._stages[0].producer  # noqa: SLF001
        lanes = producer.lanes
        put = tuple(f.name for f in producer._direct_fetches())  # noqa: SLF001
        head = tuple(t.name for t in lanes.split.cut)
        bodies = [tuple(f.name for f in producer._body_fetches(i)) for i in range(4)]  # noqa: SLF001

        def made() -> tuple[set, set]:  # (callables' fetch lists, run()'s fetch lists)
            return ({names for names, _ in list(producer.runs._callables)},  # noqa: SLF001
                    set(producer.runs._run_signatures))  # noqa: SLF001

        assert producer.num_threads == 1 and made() == (set(), {put}) and producer.runs.builds == 1
        assert not any(producer._ready)  # noqa: SLF001
        producer.tuner.tune_num_threads = producer.tuner.tune_capacity = producer.tuner.tune_pool = False  # only us
        producer.apply(3, producer.tuner.capacity)
        got = [int(sess.run(y)) for _ in range(300)]
        assert got == [3 * i for i in range(10, 310)]
        wait_until(lambda: all(producer._ready[:3]), "lanes 0 to 2 warmed")  # noqa: SLF001
        got = [int(sess.run(y)) for _ in range(100)]
        assert got == [3 * i for i in range(310, 410)]
        assert all(producer.lane_batches[i] > 0 for i in (1, 2))   # the lanes ran once ready
        callables, runs = made()
        assert callables == {(lanes.lanes[i].occupancy.name,) for i in range(3)}
        assert {put, head, bodies[1], bodies[2]} <= runs <= {put, head, *bodies[:3]}
        assert producer.runs.builds == len(callables) + len(runs) == threads.executor_builds()[0].builds
        assert not producer._ready[3] and producer.lane_batches[3] == 0  # noqa: SLF001
    assert len(lanes.lanes) == 4
