"""The training graph of the scale-out tests, and how its steps are run and recorded.

    dataset(range(ROWS)) -> map(row -> x, name) -> batch -> iterator -> staged()
        -> body: sqrt/log/hash of x and name (stateless, moves to the input tasks)
        -> loss(w) -> train_op ;  rows (a target: the row ids of the batch trained on)
"""

from __future__ import annotations

import tensorflow as tf

import smartstage as ss
from tests.bounds import HANG_MILLIS

ROWS = 50
BATCH = 4
STEP_MILLIS = HANG_MILLIS


def slow_read(x: tf.Tensor, millis: int) -> tf.Tensor:
    """`x` after `millis` ms of waiting that uses no CPU (stateless in effect: the same x gives the same value)."""
    from tensorflow.python.data.experimental.ops import testing

    slow = tf.data.Dataset.from_tensors(x).apply(testing.sleep(millis * 1000))
    return tf.data.experimental.get_single_element(slow)


def build(rows: int = ROWS, batch: int = BATCH, slow_millis: int = 0, num_threads: int = 1) -> dict:
    """Builds the graph into the default graph; returns the names the trainer fetches and runs."""
    tf.compat.v1.set_random_seed(5)
    ds = tf.data.Dataset.range(rows).map(
        lambda i: {"row": i, "x": tf.cast(tf.stack([i, i * i % 7, i % 3]), tf.float32),
                   "name": tf.strings.as_string(i % 11)})
    ds = ds.batch(batch)
    iterator = tf.compat.v1.data.make_initializable_iterator(ds)
    batch_in = iterator.get_next()
    if slow_millis:  # per-batch latency on the prefetch side (a storage read): a dataset of this batch that sleeps
        batch_in = dict(batch_in, x=slow_read(batch_in["x"], slow_millis))
    f = ss.staged(batch_in, capacity=2, num_threads=num_threads)
    x = tf.math.log1p(tf.sqrt(tf.abs(f["x"]) + 1.0)) * 3.0
    ids = tf.strings.to_hash_bucket_fast(f["name"], 13)
    w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.constant_initializer(0.1))
    e = tf.compat.v1.get_variable("e", [13, 1], initializer=tf.compat.v1.constant_initializer(0.05))
    logits = tf.reduce_sum(tf.matmul(x, w), 1) + tf.reduce_sum(tf.nn.embedding_lookup(e, ids), 1)
    loss = tf.reduce_mean(tf.square(logits - 1.0), name="loss")
    rows_seen = tf.identity(f["row"], name="rows_seen")
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train_op")
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    return {"loss": loss.name, "rows": rows_seen.name, "train_op": train_op.name,
            "init": iterator.initializer.name}
