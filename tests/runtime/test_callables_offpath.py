"""Executor builds off the step's path (runtime/producers/callables.py): a pool switch keeps producing with
the old callable while the new one is built, at low priority, and `builds` flags every window that overlaps."""

from __future__ import annotations

import os
import threading

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.runtime.producers import callables
from smartstage.runtime.producers.callables import BUILD_NICE, ProducerRuns
from tests.runtime.helpers import wait_until

SHARED = config_pb2.RunOptions(timeout_in_ms=20000)
OWN = config_pb2.RunOptions(timeout_in_ms=20000, inter_op_thread_pool=0)  # another options object: another callable


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_pool_switch_runs_the_old_callable_until_the_new_one_is_built(graph):
    queue = tf.queue.FIFOQueue(100, [tf.int64], shapes=[[]])
    counter = tf.Variable(0, dtype=tf.int64)
    put = queue.enqueue([counter.assign_add(1)])
    with tf.control_dependencies([put]):
        size = queue.size()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(counter.initializer)
        runs = ProducerRuns(sess)
        assert runs.run([size], SHARED) == [1]
        built = runs.builds
        assert built == 1 and runs.builds == built  # nothing under way: the count holds still
        release, seen_niceness = threading.Event(), []
        base_make = sess._make_callable_from_options  # noqa: SLF001

        def slow_make(callable_options):
            seen_niceness.append(_niceness())
            release.wait(30)
            return base_make(callable_options)

        sess._make_callable_from_options = slow_make  # noqa: SLF001
        # The switch: the run does not wait for the new executors; the old callable puts batch 2 and 3.
        assert runs.run([size], OWN) == [2]
        assert runs.run([size], OWN) == [3]
        first, second = runs.builds, runs.builds
        assert first != built and second != first  # a window overlapping the build is never judged
        release.set()
        wait_until(lambda: len(runs._callables) == 2, "the new options' callable")  # noqa: SLF001
        after = runs.builds
        assert runs.builds == after and runs.run([size], OWN) == [4]
        assert seen_niceness == [min(19, _niceness() + BUILD_NICE)]
        assert sorted(int(v) for v in sess.run(queue.dequeue_many(4))) == [1, 2, 3, 4]


def test_a_low_priority_build_runs_niced_and_an_urgent_one_does_not(graph, monkeypatch):
    value = tf.constant(7)
    seen = []
    with tf.compat.v1.Session(graph=graph) as sess:
        base_make = sess._make_callable_from_options  # noqa: SLF001

        def recording_make(callable_options):
            seen.append((threading.current_thread().name, _niceness()))
            return base_make(callable_options)

        sess._make_callable_from_options = recording_make  # noqa: SLF001
        runs = ProducerRuns(sess)
        mine = _niceness()
        runs.prepare([value], SHARED)                      # the first batch's: on the path, at our priority
        runs.prepare([value], OWN, low_priority=True)      # a lane's warm-up: niced, in a helper thread
        assert runs.run([value], OWN) == [7] and runs.run([value], SHARED) == [7]
    assert seen[0] == (threading.current_thread().name, mine)
    assert seen[1] == ("smartstage-executor-build", min(19, mine + BUILD_NICE))
    assert callables.BUILD_NICE > 0


def test_a_build_error_in_a_low_priority_build_reaches_the_caller(graph):
    value = tf.constant(1)
    with tf.compat.v1.Session(graph=graph) as sess:
        def failing_make(callable_options):
            raise tf.errors.InvalidArgumentError(None, None, "no executors for you")

        sess._make_callable_from_options = failing_make  # noqa: SLF001
        runs = ProducerRuns(sess)
        assert runs.prepare([value], SHARED, low_priority=True) is None  # a session that cannot: run() instead
        assert runs.run([value], SHARED) == [1]
