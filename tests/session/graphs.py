"""Small training graphs for the session tests, each built into the default graph by a factory.

Every wait in these tests is bounded: steps run with RunOptions(timeout_in_ms=...), so a bug fails
a test instead of hanging it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

import smartstage as ss
from tests.bounds import HANG_MILLIS

STEP_MILLIS = HANG_MILLIS
ROWS = 64
BATCH = 4


def bounded() -> tf.compat.v1.RunOptions:
    return tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)


def flag(on: bool = True) -> "ss.ConfigProto":
    """The DeepRec spelling of the SmartStage flag."""
    config = ss.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = on
    return config


def lanes_flag(on: bool = True, **options) -> tf.compat.v1.ConfigProto:
    """The flag with a tf.data stage kept as lanes (tf_data_stage="lanes", no DeepRec spelling): for tests of
    the rebuilt buffer and its prefetch threads, not of the fold into the dataset."""
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), tf_data_stage="lanes", **options)
    config.graph_options.rewrite_options.custom_optimizers[0].parameter_map["do_smart_stage"].b = on
    return config


@dataclass
class Model:
    train_op: tf.Operation
    loss: tf.Tensor
    features: dict            # the stage's outputs (old take outputs after a rewrite)
    ids: tf.Tensor            # moves, and crosses the stage (the embedding lookup reads it)
    scaled: tf.Tensor         # moves, and does not cross (only `normalized` reads it)
    normalized: tf.Tensor     # moves, crosses
    extra: dict = field(default_factory=dict)


def dataset_features(rows: int = ROWS, batch: int = BATCH, seed: int = 0, num_epochs: int | None = None):
    rng = np.random.default_rng(seed)
    cats = np.array([f"c{int(i)}" for i in rng.integers(0, 50, rows)])
    dense = rng.standard_normal((rows, 3)).astype(np.float32)
    label = rng.integers(0, 2, rows).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices({"cat": cats, "dense": dense, "label": label})
    ds = ds.repeat(num_epochs).batch(batch, drop_remainder=True)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()


def small_model(stage: bool = True, num_epochs: int | None = None, guard: bool = False, **stage_options) -> Model:
    """
        dataset -> stage -> cat -> hash (ids) ----------------> embed(w) --\\
                         -> dense -> abs (scaled) -> log1p (normalized) ---> logits -> loss(label) -> train
                         -> label ----------------------------------------------------/
    guard=True adds an Assert on the hashed ids as a control input of the loss (a control edge that
    crosses the cut: it must keep running every step). `stage_options` go to ss.staged.
    """
    tf.compat.v1.set_random_seed(7)
    f = dataset_features(num_epochs=num_epochs)
    if stage:
        f = ss.staged(f, **{"num_threads": 1, **stage_options})
    ids = tf.strings.to_hash_bucket_fast(f["cat"], 50, name="ids")
    scaled = tf.abs(f["dense"], name="scaled")
    normalized = tf.math.log1p(scaled, name="normalized")
    w = tf.compat.v1.get_variable("w", [50, 1], initializer=tf.compat.v1.random_uniform_initializer(seed=3))
    v = tf.compat.v1.get_variable("v", [3, 1], initializer=tf.compat.v1.random_uniform_initializer(seed=4))
    logits = tf.reduce_sum(tf.nn.embedding_lookup(w, ids), 1) + tf.reduce_sum(tf.matmul(normalized, v), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=f["label"], logits=logits))
    if guard:
        check = tf.raw_ops.Assert(condition=tf.reduce_all(ids < 50), data=[ids], name="ids_in_range")
        with tf.control_dependencies([check]):
            loss = tf.identity(loss, name="guarded_loss")
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    return Model(train_op=train_op, loss=loss, features=f, ids=ids, scaled=scaled, normalized=normalized)


def init_ops(graph: tf.Graph) -> tf.Operation:
    with graph.as_default():
        return tf.group(tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer())
