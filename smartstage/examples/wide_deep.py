"""A Wide&Deep-like model on the Criteo-like CSV.

    parsed -> stage -> preprocess -> ids, crosses, buckets -> offset, sparse concat -> linear weights(w) -\\
                                  -> ids -> embeddings(w) + dense -> concat -> deep MLP --------------> + -> logit
        logit -> loss -> gradients -> Ftrl (wide) + Adagrad or Adam (deep)

The wide part is one linear weight vector over the union of every categorical id space (hashed
crosses included): each feature's ids are offset into it and all are concatenated into one
SparseTensor, summed by one lookup. The deep part embeds the single- and multi-valued
categorical features. One backward pass feeds both optimizers.
"""

from __future__ import annotations

from typing import Mapping, Optional

import tensorflow as tf

from smartstage.examples.feature_pipeline import build_feature_pipeline
from smartstage.examples.features import CategoricalInput, categorical_inputs, combined_ids
from smartstage.examples.graph_mode import builds_a_v1_graph
from smartstage.examples.inputs import finish_initialization
from smartstage.examples.layers import Seeds, embed, embedding_table, mlp
from smartstage.examples.options import InputOptions, ModelGraph, StageFn, WideDeepOptions, no_stage


@builds_a_v1_graph
def build_wide_deep(
    data_path: str,
    vocabulary_paths: Optional[Mapping[str, str]] = None,
    *,
    stage_fn: StageFn = no_stage,
    options: WideDeepOptions = WideDeepOptions(),
    input_options: InputOptions = InputOptions(),
) -> ModelGraph:
    """Builds the Wide&Deep-like training graph into the default graph (eager mode: a new one, model.graph).

        model = build_wide_deep(files.data_path, files.vocabulary_paths, stage_fn=staged)
        sess.run([model.train_op, model.loss])
    """
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.set_random_seed(options.seed)
    seeds = Seeds(options.seed)
    feats = options.features
    scope = tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(scope, use_resource=options.use_resource):
        pipeline = build_feature_pipeline(data_path, vocabulary_paths, input_options, feats, stage_fn)
        features = pipeline.features
        with tf.compat.v1.variable_scope("wide_deep") as model_scope:
            with tf.compat.v1.variable_scope("wide"):
                inputs = categorical_inputs(features, feats, pipeline.tables, crosses=True)
                ids, num_ids = combined_ids(inputs, "wide_ids")
                weights = embedding_table("weights", num_ids, 1, seeds)
                linear = embed(weights, CategoricalInput("wide", num_ids, sparse_ids=ids), combiner="sum")
                bias = tf.compat.v1.get_variable("bias", shape=[1], initializer=tf.compat.v1.zeros_initializer())
                wide_logit = tf.add(linear, bias, name="wide_logit")
            with tf.compat.v1.variable_scope("deep"):
                embedded = [
                    embed(embedding_table(feature.name, feature.num_ids, options.embedding_dim, seeds), feature)
                    for feature in categorical_inputs(features, feats, pipeline.tables, crosses=False)
                ]
                deep_in = tf.concat([features["dense"], *embedded], axis=1, name="deep_input")
                hidden = mlp(deep_in, options.deep_mlp, "mlp", seeds)
                deep_logit = mlp(hidden, (1,), "logit", seeds, last_activation=False)
            logits = tf.add(wide_logit, deep_logit, name="logits")
        labels = features["label"]
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
        predictions = tf.math.sigmoid(logits, name="predictions")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        trainable = tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES
        wide_vars = tf.compat.v1.get_collection(trainable, scope=f"{model_scope.name}/wide/")
        deep_vars = tf.compat.v1.get_collection(trainable, scope=f"{model_scope.name}/deep/")
        grads = tf.gradients(loss, wide_vars + deep_vars, name="gradients")
        wide_train = tf.compat.v1.train.FtrlOptimizer(options.wide_learning_rate).apply_gradients(
            list(zip(grads[: len(wide_vars)], wide_vars)), name="wide_train"
        )
        if options.deep_optimizer == "adam":  # TF1 Adam decays its slots densely: slow on big tables
            deep_optimizer = tf.compat.v1.train.AdamOptimizer(options.deep_learning_rate)
        else:
            deep_optimizer = tf.compat.v1.train.AdagradOptimizer(options.deep_learning_rate)
        deep_train = deep_optimizer.apply_gradients(
            list(zip(grads[len(wide_vars):], deep_vars)), global_step=global_step, name="deep_train"
        )
        train_op = tf.group(wide_train, deep_train, name="train_op")
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
        fetches={"loss": loss, "predictions": predictions, "labels": labels, "wide_logit": wide_logit},
        preprocessed=features,
    )
