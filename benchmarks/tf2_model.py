"""The TF2 benchmark's DLRM-like program: one preprocessing function, one model, three ways to run them.

    raw = raw_batches(files, options)                  # TextLineDataset -> batch -> parse (decode_csv): columns
    step = in_model_step(model, tables)                # preprocess(columns) inside the tf.function step
    handwritten = raw.map(preprocess, AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)   # the TF guide's way
    (split dataset, split step) = SmartStage's split of `step` over `raw`

The preprocessing is what a DLRM-like job keeps inside its step: dense values filled, log-scaled and
bucketized (Bucketize), 13 categorical columns looked up in vocabulary tables (StaticVocabularyTable from
files), 13 hashed (tf.strings.to_hash_bucket_fast), 6 crosses (tf.strings.join + hash), all offset into one
embedding table. The model: that table (gathered, summed per feature group), a bottom MLP on the dense
values, a top MLP, a sigmoid cross-entropy loss, plain SGD (sparse updates for the table). Every variable
starts from numpy arrays of a fixed seed, so each program gets its own identical copy.
`device_ms > 0`: the step waits that long on its loss (benchmarks/accelerator.device_wait), a host-idle wait
standing for the model's compute on an accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from benchmarks.accelerator import device_wait
from smartstage.examples.data import ALL_COLUMNS, CATEGORICAL_COLUMNS, DENSE_COLUMNS, FIELD_DELIMITER, CriteoFiles

LOOKUP_COLUMNS = CATEGORICAL_COLUMNS[:13]
HASHED_COLUMNS = CATEGORICAL_COLUMNS[13:]
CROSSES = (("C1", "C2"), ("C3", "C4"), ("C5", "C6"), ("C14", "C15"), ("C16", "C17"), ("C18", "C19"))
BOUNDARIES = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0]


@dataclass(frozen=True)
class Tf2Options:
    batch_size: int = 256
    embedding_dim: int = 16
    hash_buckets: int = 2000
    cross_buckets: int = 5000
    oov_buckets: int = 8
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32)
    learning_rate: float = 0.05
    device_ms: float = 0.0
    seed: int = 0
    per_example_loss: bool = False  # the Keras kinds' loss unreduced, Keras reduces it (as a strategy requires)


def on_device(options: Tf2Options, device_ms: float) -> Tf2Options:
    """The accelerator setting: the model's compute waits `device_ms` per step, and the host keeps a tiny model.

        on_device(Tf2Options(), 5.0)   # before: 16-dim embeddings, MLPs of 64 (the CPU setting: all on the host)
                                       # after:  4-dim embeddings, MLPs of 8 and a 5 ms host-idle wait per step
    As benchmarks/accelerator.device_options does for the v1 models: on a device the host keeps the input,
    the preprocessing wherever the program puts it, and the step's small host-side ops.
    """
    if device_ms <= 0:
        return options
    return replace(options, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), device_ms=device_ms)


def parse(lines: tf.Tensor) -> dict[str, tf.Tensor]:
    """decode_csv of a batch of lines: label int32, I* float32 (NaN when empty), C* strings."""
    defaults = [[0] if name == "label" else [float("nan")] if name in DENSE_COLUMNS else [""] for name in ALL_COLUMNS]
    return dict(zip(ALL_COLUMNS, tf.io.decode_csv(lines, defaults, field_delim=FIELD_DELIMITER)))


def raw_batches(files: CriteoFiles, options: Tf2Options) -> tf.data.Dataset:
    """The raw input every program reads: the CSV, repeated, batched, parsed (a parallel deterministic map)."""
    lines = tf.data.TextLineDataset(files.data_path).repeat().batch(options.batch_size, drop_remainder=True)
    return lines.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class Tables:
    """The vocabulary tables (read-only, built from files once): what the preprocessing looks up."""

    def __init__(self, files: CriteoFiles, options: Tf2Options):
        self.sizes = {}
        self.tables = {}
        for name in LOOKUP_COLUMNS:
            path = files.vocabulary_paths[name]
            with open(path, encoding="ascii") as handle:
                self.sizes[name] = sum(1 for _ in handle) + options.oov_buckets
            self.tables[name] = tf.lookup.StaticVocabularyTable(
                tf.lookup.TextFileInitializer(path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                                              tf.lookup.TextFileIndex.LINE_NUMBER),
                num_oov_buckets=options.oov_buckets)


def id_space(tables: Tables, options: Tf2Options) -> tuple[list[int], int]:
    """Each id feature's offset into the one embedding table, and the table's rows."""
    sizes = ([tables.sizes[name] for name in LOOKUP_COLUMNS] + [options.hash_buckets] * len(HASHED_COLUMNS)
             + [options.cross_buckets] * len(CROSSES) + [len(BOUNDARIES) + 1] * len(DENSE_COLUMNS))
    offsets = np.cumsum([0] + sizes)
    return [int(x) for x in offsets[:-1]], int(offsets[-1])


def make_preprocess(tables: Tables, options: Tf2Options) -> Callable[[Mapping[str, tf.Tensor]], dict]:
    """preprocess(columns) -> {"dense": [B,13] float32, "ids": [B,45] int64, "label": [B,1] float32}."""
    offsets, _ = id_space(tables, options)

    def preprocess(columns: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        dense = []
        buckets = []
        for name in DENSE_COLUMNS:
            value = columns[name]
            filled = tf.where(tf.math.is_nan(value), tf.zeros_like(value), value)
            scaled = tf.math.log1p(tf.maximum(filled, 0.0))
            dense.append(scaled)
            buckets.append(tf.cast(tf.raw_ops.Bucketize(input=scaled, boundaries=BOUNDARIES), tf.int64))
        ids = [tables.tables[name].lookup(tf.strings.strip(columns[name])) for name in LOOKUP_COLUMNS]
        ids += [tf.strings.to_hash_bucket_fast(tf.strings.lower(columns[name]), options.hash_buckets)
                for name in HASHED_COLUMNS]
        ids += [tf.strings.to_hash_bucket_fast(tf.strings.join([columns[a], columns[b]], separator="_"),
                                               options.cross_buckets) for a, b in CROSSES]
        ids += buckets
        offset_ids = tf.stack([i + offset for i, offset in zip(ids, offsets)], axis=1)
        label = tf.reshape(tf.cast(columns["label"], tf.float32), [-1, 1])
        return {"dense": tf.stack(dense, axis=1), "ids": offset_ids, "label": label}

    return preprocess


class Model:
    """The DLRM-like model's variables, from numpy arrays of `options.seed`: the same start for every copy."""

    def __init__(self, num_ids: int, options: Tf2Options):
        rng = np.random.default_rng(options.seed)
        dim = options.embedding_dim

        def variable(shape, scale, name):
            return tf.Variable(rng.uniform(-scale, scale, shape).astype(np.float32), name=name)

        self.table = variable([num_ids, dim], 0.05, "embedding")
        self.bottom = self._mlp(variable, len(DENSE_COLUMNS), options.bottom_mlp, "bottom")
        groups = 4  # lookups, hashes, crosses, buckets: each summed to one [B, dim] vector
        self.top = self._mlp(variable, options.bottom_mlp[-1] + groups * dim, (*options.top_mlp, 1), "top")
        self.options = options

    @staticmethod
    def _mlp(variable, width, layers, name):
        weights = []
        for k, out in enumerate(layers):
            weights += [variable([width, out], (6.0 / (width + out)) ** 0.5, f"{name}_w{k}"),
                        tf.Variable(np.zeros([out], np.float32), name=f"{name}_b{k}")]
            width = out
        return weights

    @property
    def variables(self) -> list[tf.Variable]:
        return [self.table, *self.bottom, *self.top]

    @staticmethod
    def _apply_mlp(x, weights, last_linear):
        for k in range(0, len(weights), 2):
            x = tf.matmul(x, weights[k]) + weights[k + 1]
            if not (last_linear and k == len(weights) - 2):
                x = tf.nn.relu(x)
        return x

    def loss(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        bottom = self._apply_mlp(features["dense"], self.bottom, last_linear=False)
        rows = tf.gather(self.table, features["ids"])  # [B, 45, dim]
        bounds = np.cumsum([0, len(LOOKUP_COLUMNS), len(HASHED_COLUMNS), len(CROSSES), len(DENSE_COLUMNS)])
        groups = [tf.reduce_sum(rows[:, a:b], axis=1) for a, b in zip(bounds[:-1], bounds[1:])]
        logits = self._apply_mlp(tf.concat([bottom, *groups], axis=1), self.top, last_linear=True)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(features["label"], logits))

    def train(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """One SGD step on preprocessed features; returns the loss (after the device wait, if any)."""
        with tf.GradientTape() as tape:
            loss = self.loss(features)
        grads = tape.gradient(loss, self.variables)
        rate = self.options.learning_rate
        for variable, grad in zip(self.variables, grads):
            if isinstance(grad, tf.IndexedSlices):
                variable.scatter_sub(tf.IndexedSlices(rate * grad.values, grad.indices, grad.dense_shape))
            else:
                variable.assign_sub(rate * grad)
        if self.options.device_ms > 0:
            loss = device_wait(loss, self.options.device_ms)
        return loss


def in_model_step(model: Model, preprocess: Callable) -> Callable:
    """The baseline: the step preprocesses the raw columns itself (what SmartStage splits)."""
    @tf.function
    def step(columns):
        return model.train(preprocess(columns))

    return step


def preprocessed_step(model: Model) -> Callable:
    """The hand-written version's step: it takes what `dataset.map(preprocess)` produced."""
    @tf.function
    def step(features):
        return model.train(features)

    return step
