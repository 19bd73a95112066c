"""The small graph `smartstage demo` optimizes: readable, a few ops of each kind.

    TextLineDataset -> batch -> iterator -> decode_csv(label, I1, C1, C2) -> stage
        -> I1: fill missing, log1p, scale ------------------------------> x dense_w(w) --\\
        -> C1: hash ----------------------------------------------------> embed(w) -----+-> logits -> loss -> Adagrad
        -> C1 + "_" + C2: string join, hash (a feature cross) -----------> embed(w) ----/
        -> label: cast, reshape -----------------------------------------------------------/

Before SmartStage only decode_csv is behind the stage; after it, the fill, log, hashes, join and
casts are too, and the lookups, matmul, loss and optimizer stay on the main side.
"""

from __future__ import annotations

import tensorflow as tf

from smartstage.examples.graph_mode import builds_a_v1_graph
from smartstage.examples.inputs import finish_initialization, read_batches
from smartstage.examples.layers import Seeds
from smartstage.examples.options import InputOptions, ModelGraph, StageFn, no_stage

DEMO_COLUMNS = ("label", "I1", "C1", "C2")


@builds_a_v1_graph
def build_demo(
    data_path: str,
    stage_fn: StageFn = no_stage,
    *,
    batch_size: int = 8,
    hash_size: int = 64,
    embedding_dim: int = 4,
    num_epochs: int | None = None,
    seed: int = 7,
) -> ModelGraph:
    """Builds the demo training graph into the default graph (eager mode: a new one, model.graph); reads a
    `write_criteo_csv` file."""
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.set_random_seed(seed)
    seeds = Seeds(seed)
    pipeline = read_batches(
        data_path, InputOptions(reader="dataset", batch_size=batch_size, num_epochs=num_epochs), columns=DEMO_COLUMNS
    )
    parsed = dict(pipeline.columns)
    staged = dict(stage_fn(parsed))
    with tf.name_scope("preprocess"):
        label = tf.reshape(tf.cast(staged["label"], tf.float32), [-1, 1], name="label")
        count = tf.where(tf.math.is_nan(staged["I1"]), tf.zeros_like(staged["I1"]), staged["I1"], name="fill_I1")
        count = tf.reshape(tf.math.log1p(tf.maximum(count, 0.0)) / 4.0, [-1, 1], name="I1_scaled")
        c1_ids = tf.strings.to_hash_bucket_fast(staged["C1"], hash_size, name="hash_C1")
        pair = tf.strings.join([staged["C1"], staged["C2"]], separator="_", name="join_C1_C2")
        pair_ids = tf.strings.to_hash_bucket_fast(pair, hash_size, name="hash_C1_C2")
    with tf.compat.v1.variable_scope("model", use_resource=True):
        init = tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=seeds.next())
        c1_table = tf.compat.v1.get_variable("C1_embedding", [hash_size, embedding_dim], initializer=init)
        init = tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=seeds.next())
        pair_table = tf.compat.v1.get_variable("C1_C2_embedding", [hash_size, embedding_dim], initializer=init)
        dense_w = tf.compat.v1.get_variable("dense_w", [1, embedding_dim], initializer=tf.compat.v1.ones_initializer())
        out_w = tf.compat.v1.get_variable(
            "out_w", [embedding_dim, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=seeds.next())
        )
        hidden = tf.nn.embedding_lookup(c1_table, c1_ids) + tf.nn.embedding_lookup(pair_table, pair_ids)
        hidden = tf.nn.relu(hidden + tf.matmul(count, dense_w))
        logits = tf.matmul(hidden, out_w, name="logits")
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(label, logits)
    predictions = tf.math.sigmoid(logits, name="predictions")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step, name="train_op")
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    init_op = finish_initialization(pipeline.iterator_initializer)
    return ModelGraph(
        graph=graph,
        train_op=train_op,
        loss=loss,
        global_step=global_step,
        predictions=predictions,
        features=staged,
        parsed=parsed,
        init_op=init_op,
        fetches={"loss": loss, "predictions": predictions, "labels": label},
        preprocessed={"label": label, "I1": count, "C1": c1_ids, "C1_C2": pair_ids},
    )
