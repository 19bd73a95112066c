"""TF2 training programs for the tests: a DLRM-like custom loop (tf.strings, hashing, a vocabulary table,
bucketizing inside the step) built fresh with the same seeds each time, and its raw dataset.

    program = dlrm_program()                 # new variables, table and optimizer, same initial values
    losses = [float(program.step(b)) for b in raw_dataset()]

    raw batch {"user": b"u3", "tags": b"t1|t4", "price": 1.7, "label": 1.0}
      -> user: vocab table lookup       tags: split '|', hash to 16 buckets      price: Bucketize, x scale
      -> embedding(w) -> dense(w) -> loss -> Adam         (variables and the optimizer stay in the step)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

USERS = [f"u{i}" for i in range(6)]
BATCH = 8
BATCHES = 60


def raw_dataset(batches: int = BATCHES, batch: int = BATCH) -> tf.data.Dataset:
    rng = np.random.default_rng(7)
    n = batches * batch
    users = rng.choice(USERS + ["stranger"], n)
    tags = ["|".join(f"t{j}" for j in rng.choice(8, rng.integers(1, 4), replace=False)) for _ in range(n)]
    price = rng.uniform(0, 4, n).astype(np.float32)
    label = (rng.uniform(size=n) < 0.5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        {"user": users, "tags": np.array(tags), "price": price, "label": label}).batch(batch)


@dataclass
class Program:
    step: Any  # the @tf.function training step
    table: Any
    embedding: tf.Variable
    dense: tf.Variable
    scale: tf.Variable  # not trainable, only read: may move with the bucketizing
    optimizer: Any

    def weights(self) -> list[np.ndarray]:
        return [self.embedding.numpy(), self.dense.numpy()] + [v.numpy() for v in self.optimizer.variables]


def dlrm_program(learning_rate: float = 0.05) -> Program:
    """A fresh DLRM-like program; every call gives the same initial values."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(USERS), tf.range(len(USERS), dtype=tf.int64)), default_value=6)
    embedding = tf.Variable(tf.random.stateless_normal([7 + 16 + 4, 4], seed=[1, 2]), name="embedding")
    dense = tf.Variable(tf.random.stateless_normal([13, 1], seed=[3, 4]) * 0.1, name="dense")
    scale = tf.Variable(0.5, trainable=False, name="price_scale")
    optimizer = tf.keras.optimizers.Adam(learning_rate)

    @tf.function
    def train_step(batch):
        user = table.lookup(batch["user"])
        tags = tf.strings.split(batch["tags"], "|")
        tag_ids = tf.strings.to_hash_bucket_fast(tags, 16) + 7
        bucket = tf.raw_ops.Bucketize(input=batch["price"], boundaries=[1.0, 2.0, 3.0])
        price = tf.expand_dims(batch["price"] * scale, 1)
        with tf.GradientTape() as tape:
            u = tf.nn.embedding_lookup(embedding, user)
            t = tf.nn.embedding_lookup(embedding, tag_ids.to_tensor(default_value=0))
            b = tf.nn.embedding_lookup(embedding, tf.cast(bucket, tf.int64) + 23)
            x = tf.concat([u, tf.reduce_sum(t, 1), b, price], 1)
            logits = tf.squeeze(tf.matmul(x, dense), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(batch["label"], logits))
        grads = tape.gradient(loss, [embedding, dense])
        optimizer.apply_gradients(zip(grads, [embedding, dense]))
        return loss

    return Program(train_step, table, embedding, dense, scale, optimizer)


def run_losses(step, dataset, steps: int | None = None) -> list[float]:
    losses = []
    for batch in dataset:
        losses.append(float(step(batch)))
        if steps is not None and len(losses) == steps:
            break
    return losses
