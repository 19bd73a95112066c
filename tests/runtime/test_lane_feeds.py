"""The head's run fetches the values the body reads and each lane's run feeds them to the original body ops.

    range -> GetNext -> parse: x*2 --> hash: lookup(table, parse) + offset --> put
    Const offset ----------------------^        table (handle, read-only) --^

The lanes add no copy of the body: every lane runs the user's own ops (the table, the Const), fed its
batch's head values, so a stateful head op still runs once per batch and a body the graph cannot copy
(a control-flow-v1 loop) runs on lanes like any other; every batch keeps its unstaged values and order.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smartstage.runtime as ss
from tests.runtime.helpers import drain, range_input, wait_until


def test_lanes_feed_the_head_values_to_the_original_body(graph):
    n = 12
    x = range_input(n)
    parse = tf.identity(x * 2, name="parse")
    keys = tf.range(0, 2 * n, dtype=tf.int64)
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, keys * 10), default_value=-1,
                                      name="table")
    hashed = tf.add(table.lookup(parse), tf.constant(7, tf.int64, name="offset"), name="hash")
    y = ss.staged([hashed, x], num_threads=2, capacity=2)
    finds_before = [op for op in graph.get_operations() if op.type == "LookupTableFindV2"]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.tables_initializer())
        with ss.start_prefetch_threads(sess) as threads:
            producer = threads._stages[0].producer  # noqa: SLF001
            # lanes build their executors before their first ticket while worker 0 puts (capacity 2 stops it)
            wait_until(lambda: producer._ready[1], "lane 1's executors")  # noqa: SLF001
            got = drain(sess, y)
            stats = threads.stats()[0]
            assert [t.name for t in producer.lanes.split.cut] == [x.name]   # the head hands GetNext's value
    assert [op for op in graph.get_operations() if op.type == "LookupTableFindV2"] == finds_before  # no copy
    assert [list(v) for v in got] == [[i * 20 + 7, i] for i in range(n)]
    assert stats.num_threads == 2 and all(stats.lane_batches)


def test_the_head_runs_once_per_batch(graph):
    """A stateful head op (a counter) runs exactly once per batch: a lane's body run never pulls the head."""
    counter = tf.Variable(0, dtype=tf.int64, name="counter")
    x = range_input(20)
    with tf.control_dependencies([x]):
        count = counter.assign_add(1)
    y = ss.staged([tf.identity(x * 3, name="body"), count], num_threads=4, capacity=3)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(counter.initializer)
        with ss.start_prefetch_threads(sess):
            got = drain(sess, y)
        np.testing.assert_array_equal([v[0] for v in got], np.arange(20) * 3)
        assert [int(v[1]) for v in got] == list(range(1, 21))
        assert sess.run(counter) == 20   # the end of input stops the 21st count (it waits for GetNext)


def _v1_while_side(n: int):
    """    GetNext -> x ----------------------> Enter(acc) -> Merge -> Switch -> acc + x -> NextIteration
           Const 0 -> Enter(i) -> Merge -> Less(3) -> LoopCond --^   (the counter: no batch in it)
    A control-flow-v1 loop in the body, whose counter does not depend on the batch."""
    x = range_input(n)
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        _, total = tf.compat.v1.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + x),
                                           [tf.constant(0, tf.int64), tf.zeros_like(x)])
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
    return x, tf.identity(total, name="tripled")


def test_a_control_flow_v1_loop_in_the_body_runs_on_lanes(graph):
    x, tripled = _v1_while_side(30)
    y = ss.staged([tripled, x], num_threads=4, capacity=4)
    with tf.compat.v1.Session(graph=graph) as sess:
        with ss.start_prefetch_threads(sess) as threads:
            got = drain(sess, y)
            assert len(threads._stages[0].lanes.lanes) == 4  # noqa: SLF001
    assert [(int(a), int(b)) for a, b in got] == [(3 * i, i) for i in range(30)]
