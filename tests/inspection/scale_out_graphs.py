"""A small training graph for the scale-out inspection tests (placement, explain, verify on loopback).

    range(12) -> map(row -> x float[3], name) -> batch(3, drop_remainder) -> iterator -> stage/put ~~ stage/take
        -> body (moves, then runs on the input tasks): scaled = sqrt(|x| + 1) * 2 ; ids = hash(name, 7)
        -> loss = mean((scaled @ w + sum(e[ids]) - 1)^2) -> train_op
    fixed batch shapes, so the bytes that cross the network per batch are known
"""

from __future__ import annotations

import tensorflow as tf

import smartstage as ss

ROWS, BATCH = 12, 3


def build_meta(rows: int = ROWS, batch: int = BATCH):
    """The MetaGraphDef: train_op, losses and smartstage_targets collections; the iterator's initializer runs
    with the table initializers (what verify runs before the first step)."""
    graph = tf.Graph()
    with graph.as_default():
        ds = tf.data.Dataset.range(rows).map(
            lambda i: {"x": tf.cast(tf.stack([i, i * i % 5, i % 3]), tf.float32), "name": tf.strings.as_string(i % 4)})
        iterator = tf.compat.v1.data.make_initializable_iterator(ds.batch(batch, drop_remainder=True))
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        f = ss.staged(iterator.get_next(), capacity=2, num_threads=1)
        scaled = tf.sqrt(tf.abs(f["x"]) + 1.0) * 2.0
        ids = tf.strings.to_hash_bucket_fast(f["name"], 7)
        w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.constant_initializer(0.1))
        e = tf.compat.v1.get_variable("e", [7, 1], initializer=tf.compat.v1.constant_initializer(0.05))
        logits = tf.reduce_sum(tf.matmul(scaled, w), 1) + tf.reduce_sum(tf.nn.embedding_lookup(e, ids), 1)
        loss = tf.reduce_mean(tf.square(logits - 1.0), name="loss")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, loss)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def optimized(mode: str, tasks: int, meta=None):
    meta = meta if meta is not None else build_meta()
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input", input_tasks=tasks, input_mode=mode)
    return meta, ss.optimize(meta, config, targets=["loss", "train_op"])


def build_two_stage_meta(rows: int = ROWS, batch: int = BATCH):
    """Two inputs, each behind its own stage: a -> put_a ~~ take_a -> sqrt ; b -> put_b ~~ take_b -> hash."""
    graph = tf.Graph()
    with graph.as_default():
        def stage_of(name, ds):
            iterator = tf.compat.v1.data.make_initializable_iterator(ds.batch(batch, drop_remainder=True))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
            return ss.staged(iterator.get_next(), capacity=2, num_threads=1, name=name)

        a = stage_of("stage_a", tf.data.Dataset.range(rows).map(lambda i: tf.cast(i, tf.float32)))
        b = stage_of("stage_b", tf.data.Dataset.range(rows).map(lambda i: tf.strings.as_string(i % 4)))
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.constant_initializer(0.1))
        loss = tf.reduce_mean(tf.sqrt(tf.abs(a) + 1.0) * w + tf.cast(tf.strings.to_hash_bucket_fast(b, 7), tf.float32),
                              name="loss")
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        return tf.compat.v1.train.export_meta_graph(graph=graph)
