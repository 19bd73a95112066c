"""An emulated accelerator for the examples: the model's compute as a wait of T ms that uses no host CPU.

SmartStage pays most where the model runs on an accelerator and the host CPU waits for it (DeepRec's
case: DLRM on a GPU, a few ms a step). Tests and benchmarks run without a GPU, so the device is emulated: a `numpy_function` that
sleeps T ms (`time.sleep` releases the GIL and burns no CPU) on a value derived from the step's loss,
so it cannot start before the forward pass has read this step's features. The host keeps what a GPU
job keeps on the host: reading, parsing and preprocessing (wherever the pipeline puts them), and the
step's host-side ops: the stage's take and a small stand-in of the model.

    model = build_device_model(files.data_path, files.vocabulary_paths, model="dlrm", device_ms=5.0,
                               stage_fn=ss.staged, input_options=InputOptions(batch_size=512))
    sess.run(model.train_op)     # take -> stand-in forward -> 5 ms device wait || its update -> done

`build_device_model` keeps the DLRM-like (or Wide&Deep-like) builder's input pipeline op for op (reading,
parsing, hashing, vocabulary lookups, crosses, bucketizing, the combined id spaces) and replaces the model
(embeddings, MLPs, interaction, sparse optimizer updates: the work a GPU would run) with a stand-in: every preprocessed feature summarised to one number, a
linear layer of a few dozen weights, the loss, and the wait. `with_device_step` instead adds the wait to
any model (its host compute stays).

In TF2, call `device_wait(loss, 5.0)` inside the `tf.function` step and return (or add 0 x) its result.

The wait holds one inter-op thread for T ms, as a host thread blocked on a device sync would; a real
device's launches and copies cost host CPU that the emulation leaves out (the tiny model's host ops
stand in for them).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import numpy as np
import tensorflow as tf

from smartstage.examples.data import CATEGORICAL_COLUMNS
from smartstage.examples.feature_pipeline import build_feature_pipeline
from smartstage.examples.features import categorical_inputs, combined_ids
from smartstage.examples.graph_mode import builds_a_v1_graph
from smartstage.examples.inputs import finish_initialization
from smartstage.examples.options import DLRMOptions, InputOptions, ModelGraph, StageFn, WideDeepOptions, no_stage


def device_wait(x: tf.Tensor, device_ms: float, name: str = "emulated_device") -> tf.Tensor:
    """`x` again (same value, dtype and shape), produced after a host-idle wait of `device_ms`.

        loss = device_wait(loss, 5.0)   # before: loss ready after the forward pass
                                        # after:  the same loss, 5 ms later, no CPU used meanwhile
    """
    seconds = float(device_ms) / 1000.0

    def _wait(value: np.ndarray) -> np.ndarray:
        time.sleep(seconds)
        return value

    with tf.name_scope(name):
        out = tf.numpy_function(_wait, [x], x.dtype, stateful=True, name="wait")
        out.set_shape(x.shape)
    return out


def with_device_step(model: ModelGraph, device_ms: float) -> ModelGraph:
    """The same model whose `train_op` also waits `device_ms` on a value of this step's loss.

        model = with_device_step(build_dlrm(...), 5.0)   # before: train_op = the optimizer's update
                                                         # after:  train_op = group(update, wait(loss))
    The wait runs beside the backward pass and the update (they overlap, as a device's kernels overlap
    the host), after the forward pass; `model.loss` is unchanged, so losses compare across devices.
    """
    if device_ms <= 0:
        return model
    with model.graph.as_default():
        waited = device_wait(model.loss, device_ms)
        train_op = tf.group(model.train_op, waited, name="train_op_with_device")
    return dataclasses.replace(model, train_op=train_op)


def device_options(model: Literal["dlrm", "wide_deep"]) -> DLRMOptions | WideDeepOptions:
    """The benchmark's preprocessing with a tiny model: the host's share of a device step stays small.

        device_options("dlrm")   # before: DLRMOptions.benchmark(): 16-dim embeddings, MLPs of 64 (CPU-bound)
                                 # after:  the same features, 4-dim embeddings, MLPs of 8 (host ops ~1-2 ms)
    """
    if model == "dlrm":
        return dataclasses.replace(DLRMOptions.benchmark(), embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,))
    if model == "wide_deep":
        return dataclasses.replace(WideDeepOptions.benchmark(), embedding_dim=4, deep_mlp=(8,))
    raise ValueError(f"device_options: unknown model {model!r}; use 'dlrm' or 'wide_deep'")


def _summary(tensor) -> tf.Tensor:
    """One float32 number from a feature (ids, values or a SparseTensor's ids): what the stand-in reads."""
    values = tensor.values if isinstance(tensor, tf.SparseTensor) else tensor
    return tf.math.log1p(tf.abs(tf.reduce_mean(tf.cast(values, tf.float32))))  # ids reach 10^6: keep it small


@builds_a_v1_graph
def build_device_model(
    data_path: str,
    vocabulary_paths=None,
    *,
    model: Literal["dlrm", "wide_deep"] = "dlrm",
    device_ms: float = 5.0,
    stage_fn: StageFn = no_stage,
    options: DLRMOptions | WideDeepOptions | None = None,
    input_options: InputOptions = InputOptions(),
) -> ModelGraph:
    """The model's input pipeline as `build_dlrm` / `build_wide_deep` build it, and a device step of `device_ms`.

        build_dlrm(path, vocab, stage_fn=ss.staged)                          # before: the model's compute on the host
        build_device_model(path, vocab, model="dlrm", device_ms=5.0, ...)    # after:  a 5 ms host-idle wait
    """
    if model not in ("dlrm", "wide_deep"):
        raise ValueError(f"build_device_model: unknown model {model!r}; use 'dlrm' or 'wide_deep'")
    if options is None:
        options = DLRMOptions.benchmark() if model == "dlrm" else WideDeepOptions.benchmark()
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.set_random_seed(options.seed)
    feats = options.features
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), use_resource=True):
        pipeline = build_feature_pipeline(data_path, vocabulary_paths, input_options, feats, stage_fn)
        features = pipeline.features
        with tf.name_scope("features"):  # the builder's own id spaces: the same preprocessing work
            if model == "dlrm":
                inputs = categorical_inputs(features, feats, pipeline.tables)
                extra = [f for f in inputs if f.name not in CATEGORICAL_COLUMNS]
                kept = [f for f in inputs if f.name in CATEGORICAL_COLUMNS]
                combined = [combined_ids(extra, "engineered_ids")[0]] if extra else []
            else:
                combined = [combined_ids(categorical_inputs(features, feats, pipeline.tables, crosses=True),
                                         "wide_ids")[0]]
                kept = categorical_inputs(features, feats, pipeline.tables, crosses=False)
            read = [f.ids if f.ids is not None else f.sparse_ids for f in kept] + combined
            summaries = tf.stack([_summary(t) for t in read] + [tf.reduce_mean(features["dense"])])
        with tf.compat.v1.variable_scope("device_model"):
            weights = tf.compat.v1.get_variable("weights", [int(summaries.shape[0]), 1],
                                                initializer=tf.compat.v1.zeros_initializer())
            bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.compat.v1.zeros_initializer())
            labels = tf.reshape(tf.cast(features["label"], tf.float32), [-1, 1])
            logit = tf.matmul(tf.reshape(summaries, [1, -1]), weights) + bias
            logits = tf.broadcast_to(logit, tf.shape(labels), name="logits")
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
        predictions = tf.math.sigmoid(logits, name="predictions")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        update = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)
        train_op = tf.group(update, device_wait(loss, device_ms), name="train_op")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    return ModelGraph(graph=graph, train_op=train_op, loss=loss, global_step=global_step, predictions=predictions,
                      features=pipeline.staged, parsed=pipeline.parsed,
                      init_op=finish_initialization(pipeline.iterator_initializer),
                      fetches={"loss": loss, "predictions": predictions, "labels": labels}, preprocessed=features)
