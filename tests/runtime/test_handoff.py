"""The head hands its values to a lane inside TensorFlow (runtime/lanes/handoff.py).

    range -> GetNext -> parse: x*2 --> hash: lookup(table, parse) + offset --> put
    Const offset ----------------------^        table (handle, read-only) --^

Each lane copies exactly the ops that depend on the batch (parse, hash), reads the originals for the
rest (the table's handle, the Const), and its copy reads the lane's input queue, which the head run
fills: the head's values never pass through Python, and every batch still gives the unstaged values.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smartstage.runtime as ss
from smartstage.runtime.lanes.handoff import body_to_copy
from smartstage.runtime.lanes.lanes import lane_graph
from smartstage.runtime.lanes.split import split_prefetch_side
from smartstage.runtime.stage.metadata import stage_defs
from tests.runtime.helpers import drain, range_input, wait_until


def _side(n: int = 12):
    x = range_input(n)
    parse = tf.identity(x * 2, name="parse")
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.range(0, 2 * n, dtype=tf.int64), tf.range(0, 2 * n, dtype=tf.int64) * 10),
        default_value=-1, name="table")
    offset = tf.constant(7, tf.int64, name="offset")
    hashed = tf.add(table.lookup(parse), offset, name="hash")
    return x, parse, hashed, table


def test_the_lanes_copy_what_depends_on_the_batch_and_nothing_else_once(graph):
    x, parse, hashed, _ = _side()
    y = ss.staged([hashed, x], num_threads=2, capacity=2)
    put = graph.get_operation_by_name(next(iter(stage_defs(graph))).put_node)
    split = split_prefetch_side(put)
    copied = sorted(op.type for op in body_to_copy(put, split.head_ops, split.cut))
    assert copied == ["AddV2", "Identity", "LookupTableFindV2", "Mul"]   # parse = x*2, hash; not the handle/Const
    lanes, why = lane_graph(graph, "stage", put, put.inputs[0], 2)
    assert why == "" and all(lane.hand_in is not None for lane in lanes.lanes)
    lane = lanes.lanes[1]
    assert lane is lanes.lanes[0]   # shared lanes: one copy of the body, each run fed its ticket
    assert lane.hand_in.inputs[0] is lane.ticket and lane.hand_in.type == "MapStage"
    assert [t.name for t in lane.hand_in.inputs[2:]] == [t.name for t in split.cut]
    assert not [op for op in graph.get_operations() if op.name.startswith("stage/lanes/lane_1/")]
    body_ops = [op for op in graph.get_operations() if op.name.startswith("stage/lanes/lane_0/body/")]
    finds = [op for op in body_ops if op.type == "LookupTableFindV2"]
    assert len(finds) == 1 and finds[0].inputs[0].op.type == "HashTableV2"
    assert finds[0].inputs[0].op.name == "table"       # the original table
    assert not any(op.type in ("HashTableV2", "IteratorGetNext") or op.name.endswith("offset") for op in body_ops)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.tables_initializer())
        with ss.start_prefetch_threads(sess) as threads:
            producer = threads._stages[0].producer  # noqa: SLF001
            # lanes build their executors before their first ticket while worker 0 puts (capacity 2 stops it)
            wait_until(lambda: producer._ready[1], "lane 1's executors")  # noqa: SLF001
            got = drain(sess, y)
            stats = threads.stats()[0]
    assert [list(v) for v in got] == [[i * 20 + 7, i] for i in range(12)]
    assert stats.num_threads == 2 and all(stats.lane_batches)


def test_the_head_runs_once_per_batch_with_hand_off(graph):
    """A stateful head op (a counter) runs exactly once per batch: the copies never pull the head."""
    counter = tf.Variable(0, dtype=tf.int64, name="counter")
    x = range_input(20)
    with tf.control_dependencies([x]):
        count = counter.assign_add(1)
    y = ss.staged([tf.identity(x * 3, name="body"), count], num_threads=4, capacity=3)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(counter.initializer)
        with ss.start_prefetch_threads(sess) as threads:
            got = drain(sess, y)
            assert all(lane.hand_in is not None for lane in threads._stages[0].lanes.lanes)
        np.testing.assert_array_equal([v[0] for v in got], np.arange(20) * 3)
        assert [int(v[1]) for v in got] == list(range(1, 21))
        assert sess.run(counter) == 20   # the end of input stops the 21st count (it waits for GetNext)


def _v1_while_side(n: int = 10):
    """    GetNext -> x ----------------------> Enter(acc) -> Merge -> Switch -> acc + x -> NextIteration
           Const 0 -> Enter(i) -> Merge -> Less(3) -> LoopCond --^   (the counter: no batch in it)
    A control-flow-v1 loop whose counter does not depend on the batch: a lane's copy of the body would
    read the original loop's LoopCond from outside every loop frame, which TensorFlow refuses."""
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


def test_a_body_that_cannot_be_copied_is_refused_before_any_op_is_built(graph):
    from smartstage.runtime.lanes.handoff import copy_refusal
    x, tripled = _v1_while_side()
    ss.staged([tripled, x], num_threads=2, capacity=2)
    put = graph.get_operation_by_name(next(iter(stage_defs(graph))).put_node)
    split = split_prefetch_side(put)
    body = body_to_copy(put, split.head_ops, split.cut)
    assert any(op.type == "Merge" for op in body)
    before = len(graph.get_operations())
    why = copy_refusal(body)
    assert "while loop" in why and why.split(":")[0] in {op.name for op in body}
    assert len(graph.get_operations()) == before                     # analysis only
    assert copy_refusal(body_to_copy(put, split.head_ops, split.cut)[-1:]) == ""   # tripled alone copies


def test_a_body_that_cannot_be_copied_runs_on_lanes_that_feed_it(graph, caplog):
    """The fallback: every lane fetches the head's values and feeds the original body; order and values hold."""
    x, tripled = _v1_while_side(30)
    y = ss.staged([tripled, x], num_threads=4, capacity=4)
    with tf.compat.v1.Session(graph=graph) as sess:
        with caplog.at_level("WARNING", logger="smartstage.runtime.lanes.lanes"):
            with ss.start_prefetch_threads(sess) as threads:
                got = drain(sess, y)
                lanes = threads._stages[0].lanes.lanes
    assert lanes and all(lane.hand_in is None for lane in lanes)
    assert "instead of copying the body" in caplog.text
    assert [(int(a), int(b)) for a, b in got] == [(3 * i, i) for i in range(30)]
