"""The readers: the same batches from queue readers and tf.data, end of input, storage latency."""

import time

import numpy as np
import pytest
import tensorflow as tf

from smartstage.examples.inputs import finish_initialization, parse_lines, read_batches
from smartstage.examples.options import InputOptions


def read_all(criteo, options, max_batches=1000, columns=("label", "I1", "C1", "C26")):
    """Every batch `read_batches` yields (until OutOfRangeError or `max_batches`)."""
    graph = tf.Graph()
    with graph.as_default():
        pipeline = read_batches(criteo.data_path, options, columns=columns)
        init = finish_initialization(pipeline.iterator_initializer)
    batches = []
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
        try:
            while len(batches) < max_batches:
                batches.append(sess.run(dict(pipeline.columns)))
        except tf.errors.OutOfRangeError:
            pass
        finally:
            coord.request_stop()
            coord.join(threads)
    return batches


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize("num_epochs", [1, 2])
def test_both_readers_yield_the_same_batches_then_end(criteo, num_epochs):
    queue = read_all(criteo, InputOptions(reader="queue", batch_size=64, num_epochs=num_epochs))
    dataset = read_all(criteo, InputOptions(reader="dataset", batch_size=64, num_epochs=num_epochs))
    assert len(queue) == num_epochs * criteo.num_rows // 64, "the smaller final batch is dropped"
    assert_same_batches(queue, dataset)
    assert queue[0]["C1"].dtype == object and queue[0]["I1"].dtype == np.float32


@pytest.mark.parametrize(
    "options",
    [
        InputOptions(parse_in_dataset=True, prefetch=-1, iterator="initializable"),
        InputOptions(prefetch=3, read_latency_ms=1),
    ],
)
def test_dataset_variants_yield_the_same_batches(criteo, options):
    reference = read_all(criteo, InputOptions(batch_size=32), max_batches=5)
    variant = read_all(criteo, InputOptions(**{**options.__dict__, "batch_size": 32}), max_batches=5)
    assert_same_batches(reference, variant)


def test_empty_fields_parse_to_defaults():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        line = "1," + ",".join([""] * 13) + "," + ",".join([""] * 26)
        parsed = sess.run(parse_lines(tf.constant([line])))
    assert parsed["label"][0] == 1 and np.isnan(parsed["I5"][0]) and parsed["C7"][0] == b""


@pytest.mark.parametrize("reader", ["queue", "dataset"])
def test_read_latency_bounds_the_batch_rate(criteo, reader):
    latency = 0.03
    options = InputOptions(reader=reader, batch_size=8, read_latency_ms=latency * 1000, batch_capacity=1)
    graph = tf.Graph()
    with graph.as_default():
        pipeline = read_batches(criteo.data_path, options, columns=("label",))
        init = finish_initialization(pipeline.iterator_initializer)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
        sess.run(pipeline.columns["label"])
        start = time.perf_counter()
        for _ in range(6):
            sess.run(pipeline.columns["label"])
        elapsed = time.perf_counter() - start
        coord.request_stop()
        coord.join(threads)
    # The queue reader buffers a batch ahead (in the train.batch thread), so allow one or two for free.
    assert elapsed >= 4 * latency * 0.9


def test_queue_options_reject_dataset_only_settings():
    with pytest.raises(ValueError, match="reader='dataset'"):
        InputOptions(reader="queue", prefetch=2)
