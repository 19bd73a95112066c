"""A DLRM-like model on the Criteo-like CSV.

    parsed -> stage -> preprocess -> dense [B,13] -> bottom MLP -------------------------\\
                                  -> C1..C26 ids -> embeddings(w) [B,D] -> stack [B,27,D] -> dot interaction
                                  -> bucket, cross ids -> offset, concat -> embedding(w) --> concat -> top MLP
                                                                                   -> logit -> loss -> Adagrad

As in DLRM, the 26 categorical features and the bottom MLP's output interact pairwise. The
engineered features (bucketized dense values, crosses) share one embedding table (their ids
offset into one space, averaged) that joins after the interaction: adding crosses grows the
preprocessing, not the number of variables or the interaction.

The embedding lookups, the MLPs and the optimizer read variables and stay on the main side;
everything in `preprocess` (and the optimizer's index arithmetic) may move to the prefetch side.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import tensorflow as tf

from smartstage.examples.data import CATEGORICAL_COLUMNS
from smartstage.examples.feature_pipeline import build_feature_pipeline
from smartstage.examples.features import CategoricalInput, categorical_inputs, combined_ids
from smartstage.examples.graph_mode import builds_a_v1_graph
from smartstage.examples.inputs import finish_initialization
from smartstage.examples.layers import Seeds, embed, embedding_table, mlp
from smartstage.examples.options import DLRMOptions, InputOptions, ModelGraph, StageFn, no_stage


def dot_interaction(bottom: tf.Tensor, embeddings: list[tf.Tensor]) -> tf.Tensor:
    """DLRM's pairwise dot products of [bottom, *embeddings] (upper triangle), concatenated to bottom.

        [B, D] x F  ->  [B, F, D] @ [B, D, F] -> [B, F, F] -> upper triangle [B, F(F-1)/2] -> concat
    """
    with tf.name_scope("interaction"):
        stacked = tf.stack([bottom, *embeddings], axis=1)
        num = len(embeddings) + 1
        products = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, num * num])
        rows, cols = np.triu_indices(num, k=1)
        pairs = tf.gather(products, tf.constant((rows * num + cols).astype(np.int32)), axis=1)
        return tf.concat([bottom, pairs], axis=1)


def _embeddings(
    inputs: list[CategoricalInput], options: DLRMOptions, seeds: Seeds
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """[B, D] vectors of the categorical columns (to interact) and of the engineered features.

    fused_embedding: the single-valued columns share one table, their ids offset into it and
    stacked, so one gather and one sparse update serve them all (fewer, bigger ops).
    """
    dim = options.embedding_dim
    columns = [feature for feature in inputs if feature.name in CATEGORICAL_COLUMNS]
    extra = [feature for feature in inputs if feature.name not in CATEGORICAL_COLUMNS]
    fused = [feature for feature in columns if options.fused_embedding and feature.ids is not None]
    interacting = []
    if fused:
        offsets = np.cumsum([0] + [feature.num_ids for feature in fused])
        with tf.name_scope("fused_ids"):
            ids = tf.stack([feature.ids + int(off) for feature, off in zip(fused, offsets)], axis=1)
        table = embedding_table("fused", int(offsets[-1]), dim, seeds)
        interacting.extend(tf.unstack(tf.nn.embedding_lookup(table, ids, name="embed_fused"), axis=1))
    for feature in columns:
        if feature not in fused:
            interacting.append(embed(embedding_table(feature.name, feature.num_ids, dim, seeds), feature))
    engineered = []
    if extra:
        ids, num_ids = combined_ids(extra, "engineered_ids")
        table = embedding_table("engineered", num_ids, dim, seeds)
        engineered.append(embed(table, CategoricalInput("engineered", num_ids, sparse_ids=ids)))
    return interacting, engineered


@builds_a_v1_graph
def build_dlrm(
    data_path: str,
    vocabulary_paths: Optional[Mapping[str, str]] = None,
    *,
    stage_fn: StageFn = no_stage,
    options: DLRMOptions = DLRMOptions(),
    input_options: InputOptions = InputOptions(),
) -> ModelGraph:
    """Builds the DLRM-like training graph into the default graph (eager mode: a new one, model.graph).

        model = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=staged)
        sess.run([model.train_op, model.loss])

    With `vocabulary_paths=None` every categorical column is hashed (no lookup tables).
    """
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.set_random_seed(options.seed)
    seeds = Seeds(options.seed)
    feats = options.features
    scope = tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(scope, use_resource=options.use_resource):
        pipeline = build_feature_pipeline(data_path, vocabulary_paths, input_options, feats, stage_fn)
        features = pipeline.features
        with tf.compat.v1.variable_scope("dlrm"):
            bottom = mlp(features["dense"], (*options.bottom_mlp, options.embedding_dim), "bottom_mlp", seeds)
            inputs = categorical_inputs(features, feats, pipeline.tables)
            with tf.compat.v1.variable_scope("embeddings"):
                interacting, engineered = _embeddings(inputs, options, seeds)
            top_input = tf.concat([dot_interaction(bottom, interacting), *engineered], axis=1, name="top_input")
            hidden = mlp(top_input, options.top_mlp, "top_mlp", seeds)
            logits = mlp(hidden, (1,), "logit", seeds, last_activation=False)
        labels = features["label"]
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)  # joins the LOSSES collection
        predictions = tf.math.sigmoid(logits, name="predictions")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = tf.compat.v1.train.AdagradOptimizer(options.learning_rate)
        train_op = optimizer.minimize(loss, global_step=global_step, name="train_op")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    init_op = finish_initialization(pipeline.iterator_initializer)
    return ModelGraph(
        graph=graph,
        train_op=train_op,
        loss=loss,
        global_step=global_step,
        predictions=predictions,
        features=pipeline.staged,
        parsed=pipeline.parsed,
        init_op=init_op,
        fetches={"loss": loss, "predictions": predictions, "labels": labels, "dense": features["dense"]},
        preprocessed=features,
    )
