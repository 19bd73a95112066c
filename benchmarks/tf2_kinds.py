"""The TF2 benchmark's Keras model kinds: one CTR-style model built four ways, each run three ways.

    kinds:     tf_keras_functional, tf_keras_subclassed, keras3_subclassed, keras3_featurespace
    programs:  in_model       the model with its preprocessing layers inside, its own train_step on raw batches
               handwritten    the guides' way: raw.map(preprocessing layers), a second model on the features
               smartstage     ss.tf2.split(tf.function(model.train_step), raw, measure=True): the same model,
                              split when the timed split runs faster, else its own step on raw (as ss.tf2.fit)
               split_untimed  the same split with measure=False: split whatever the timing says

Every kind reads the same raw batches as the DLRM-like step (benchmarks/tf2_model.raw_batches: the CSV parsed
in the dataset), reshaped to Keras's (x, y): 8 categorical columns (4 looked up in their vocabulary files with
StringLookup, 4 hashed with Hashing), 4 dense columns (log1p in the model, then Normalization and
Discretization), one embedding per categorical column, an MLP, binary cross-entropy, Adam. FeatureSpace
(Keras 3) encodes the same columns its own way (string_categorical, float_normalized). With device_ms > 0 the
loss waits that long (benchmarks/accelerator.device_wait) and the MLP is tiny, as in tf2_model.on_device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from benchmarks.accelerator import device_wait
from benchmarks.tf2_model import Tf2Options, raw_batches
from smartstage.examples.data import CATEGORICAL_COLUMNS, DENSE_COLUMNS, CriteoFiles

KINDS = ("tf_keras_functional", "tf_keras_subclassed", "keras3_subclassed", "keras3_featurespace")
LOOKUP = CATEGORICAL_COLUMNS[:4]
HASHED = CATEGORICAL_COLUMNS[4:8]
DENSE = DENSE_COLUMNS[:4]
HASH_BINS = 1000
BINS = [0.5, 1.0, 2.0, 4.0]


def keras_batches(files: CriteoFiles, options: Tf2Options) -> tf.data.Dataset:
    """(x, y): the raw columns as Keras takes them, each [batch, 1]; y float32 [batch, 1]."""
    def to_xy(columns):
        x = {name: tf.expand_dims(columns[name], 1) for name in (*LOOKUP, *HASHED, *DENSE)}
        return x, tf.cast(tf.expand_dims(columns["label"], 1), tf.float32)

    return raw_batches(files, options).map(to_xy, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _library(name: str):
    if name.startswith("tf_keras"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def _loss(lib, device_ms: float, per_example: bool = False):
    if per_example:  # under a tf.distribute strategy, tf_keras takes a loss object's reduction from compile()
        bce = lib.losses.BinaryCrossentropy(from_logits=True, reduction="none" if lib.__name__ == "tf_keras" else None)
    else:
        bce = lib.losses.BinaryCrossentropy(from_logits=True)

    def loss(y_true, logits):
        value = bce(y_true, logits)
        if device_ms <= 0:
            return value
        # the same value, after the wait; the gradient flows through `value` (a numpy_function has none), so
        # the wait runs beside the backward pass and the update, as a device's kernels overlap the host
        return value + tf.stop_gradient(device_wait(value, device_ms) - value)

    return loss


def _vocabulary(files: CriteoFiles, name: str) -> list[str]:
    with open(files.vocabulary_paths[name], encoding="ascii") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


class _Layers:
    """The preprocessing layers and the trained layers of one model, from one library, with fixed seeds."""

    def __init__(self, lib, files: CriteoFiles, options: Tf2Options):
        dim = options.embedding_dim
        self.lookups = {c: lib.layers.StringLookup(vocabulary=_vocabulary(files, c), name=f"lookup_{c}")
                        for c in LOOKUP}
        self.hashes = {c: lib.layers.Hashing(num_bins=HASH_BINS, name=f"hash_{c}") for c in HASHED}
        self.normalize = lib.layers.Normalization(mean=1.0, variance=2.0, name="normalize")
        self.discretize = lib.layers.Discretization(bin_boundaries=BINS, name="discretize")
        self.normalize(tf.zeros([1, len(DENSE)]))  # built eagerly: its constants then belong to no scratch graph
        sizes = {c: self.lookups[c].vocabulary_size() for c in LOOKUP} | {c: HASH_BINS for c in HASHED}
        self.embeddings = {c: lib.layers.Embedding(sizes[c], dim, name=f"embed_{c}") for c in sizes}
        self.bucket_embedding = lib.layers.Embedding(len(BINS) + 1, dim, name="embed_buckets")
        self.hidden = [lib.layers.Dense(width, activation="relu", name=f"mlp_{k}")
                       for k, width in enumerate(options.top_mlp)]
        self.out = lib.layers.Dense(1, name="logit")
        self.lib = lib

    def preprocess(self, x):
        """Raw columns -> (ids per categorical column, normalized dense [B, 4], bucket ids [B, 4])."""
        ops = _Ops(self.lib)
        ids = {c: self.lookups[c](x[c]) for c in LOOKUP} | {c: self.hashes[c](x[c]) for c in HASHED}
        dense = ops.log1p(ops.maximum(ops.concat([x[c] for c in DENSE]), 0.0))
        return ids, self.normalize(dense), self.discretize(dense)

    def head(self, ids, dense, buckets):
        """Preprocessed features -> logits."""
        ops = _Ops(self.lib)
        parts = [ops.flatten(self.embeddings[c](ids[c])) for c in (*LOOKUP, *HASHED)]
        parts += [ops.sum1(self.bucket_embedding(buckets)), dense]
        h = ops.concat(parts)
        for layer in self.hidden:
            h = layer(h)
        return self.out(h)


class _Ops:
    """The few tensor ops the model needs, as Keras 3 (keras.ops) or tf_keras (TensorFlow ops) spells them."""

    def __init__(self, lib):
        self.k3 = hasattr(lib, "ops")
        self.ops = lib.ops if self.k3 else tf

    def concat(self, parts):
        return self.ops.concatenate(parts, axis=1) if self.k3 else tf.concat(parts, 1)

    def log1p(self, x):
        return self.ops.log1p(x) if self.k3 else tf.math.log1p(x)

    def maximum(self, x, y):
        return self.ops.maximum(x, y)

    def flatten(self, x):  # [B, 1, dim] -> [B, dim]
        return self.ops.squeeze(x, axis=1) if self.k3 else tf.squeeze(x, 1)

    def sum1(self, x):
        return self.ops.sum(x, axis=1) if self.k3 else tf.reduce_sum(x, 1)


def _inputs(lib):
    return {c: lib.Input((1,), dtype="string", name=c) for c in (*LOOKUP, *HASHED)} | \
        {c: lib.Input((1,), dtype="float32", name=c) for c in DENSE}


def _compile(model, lib, options: Tf2Options):
    model.compile(optimizer=lib.optimizers.Adam(options.learning_rate * 0.02),
                  loss=_loss(lib, options.device_ms, options.per_example_loss))
    return model


def _seed(lib, seed: int) -> None:
    if hasattr(lib.utils, "set_random_seed"):
        lib.utils.set_random_seed(seed)
    tf.random.set_seed(seed)
    np.random.seed(seed)


def _subclassed(lib, layers: _Layers):
    class CtrModel(lib.Model):
        def __init__(self):
            super().__init__(name="ctr_subclassed")
            self.parts = layers  # a plain object: Keras does not track it, so the list below holds the weights
            self.tracked = [*layers.lookups.values(), *layers.hashes.values(), layers.normalize, layers.discretize,
                            *layers.embeddings.values(), layers.bucket_embedding, *layers.hidden, layers.out]

        def call(self, x):
            return self.parts.head(*self.parts.preprocess(x))

    return CtrModel()


@dataclass
class KerasPrograms:
    """One kind's programs: (dataset, step) each; step(batch) returns the loss; notes: each program's summary."""

    programs: dict[str, tuple[tf.data.Dataset, Callable]]
    notes: dict[str, str]


def _loss_of(step: Callable) -> Callable:
    def run(batch):
        logs = step(batch)
        return logs["loss"] if isinstance(logs, dict) else logs

    return run


def build_model(kind: str, files: CriteoFiles, options: Tf2Options, sample: tf.data.Dataset) -> tuple[Any, Any, Any]:
    """(model with its preprocessing inside, preprocessing function for dataset.map, model on the features)."""
    lib = _library(kind)
    _seed(lib, options.seed)
    if kind == "keras3_featurespace":
        return _featurespace(lib, options, sample)
    layers = _Layers(lib, files, options)
    if kind.endswith("subclassed"):
        model = _subclassed(lib, layers)
        model(next(iter(sample))[0])  # builds the weights
    else:
        inputs = _inputs(lib)
        model = lib.Model(inputs, layers.head(*layers.preprocess(inputs)), name="ctr_functional")
    # The hand-written twin: the preprocessing layers in the dataset, a model that takes their outputs.
    raw_inputs = _inputs(lib)
    ids, dense, buckets = layers.preprocess(raw_inputs)
    preprocessing = lib.Model(raw_inputs, {"ids": ids, "dense": dense, "buckets": buckets}, name="preprocessing")
    feature_inputs = {"ids": {c: lib.Input((1,), dtype="int64", name=f"id_{c}") for c in (*LOOKUP, *HASHED)},
                      "dense": lib.Input((len(DENSE),), name="dense"),
                      "buckets": lib.Input((len(DENSE),), dtype="int64", name="buckets")}
    trainer = lib.Model(feature_inputs, layers.head(feature_inputs["ids"], feature_inputs["dense"],
                                                    feature_inputs["buckets"]), name="trainer")
    return _compile(model, lib, options), preprocessing, _compile(trainer, lib, options)


def _featurespace(keras, options: Tf2Options, sample: tf.data.Dataset):
    from keras.utils import FeatureSpace

    features = {c: FeatureSpace.string_categorical(num_oov_indices=1, output_mode="int") for c in LOOKUP}
    features |= {c: FeatureSpace.string_hashed(num_bins=HASH_BINS, output_mode="int") for c in HASHED}
    features |= {c: FeatureSpace.float_normalized() for c in DENSE}
    space = FeatureSpace(features, output_mode="dict")
    space.adapt(sample.map(lambda x, y: x))
    dim = options.embedding_dim

    def head(encoded):
        parts = []
        for c in (*LOOKUP, *HASHED):
            size = HASH_BINS if c in HASHED else space.preprocessors[c].vocabulary_size()
            parts.append(keras.layers.Flatten()(keras.layers.Embedding(size, dim, name=f"embed_{c}")(encoded[c])))
        parts += [encoded[c] for c in DENSE]
        h = keras.layers.Concatenate()(parts)
        for k, width in enumerate(options.top_mlp):
            h = keras.layers.Dense(width, activation="relu", name=f"mlp_{k}")(h)
        return keras.layers.Dense(1, name="logit")(h)

    encoded = space.get_encoded_features()
    model = keras.Model(space.get_inputs(), head(encoded), name="ctr_featurespace")
    feature_inputs = {c: keras.Input(t.shape[1:], dtype=t.dtype, name=c) for c, t in encoded.items()}
    trainer = keras.Model(feature_inputs, head(feature_inputs), name="trainer")
    return _compile(model, keras, options), space, _compile(trainer, keras, options)


def smartstage_programs(step: Callable, untimed_step: Callable, raw: tf.data.Dataset,
                        state: list) -> list[tuple[str, Callable, tf.data.Dataset, str]]:
    """SmartStage's two programs of one in-model step: "smartstage", split(measure=True), which keeps the step
    as it is (over raw.prefetch) when the timed split runs slower, as ss.tf2.fit does; and "split_untimed",
    split(measure=False) of a second copy, the split whatever it measures. `state`: the objects that hold the
    step's tables, as split() takes them."""
    from smartstage import tf2
    from smartstage.errors import NothingToMoveError

    try:
        split = tf2.split(step, raw, state=state, measure=True)
        smartstage = ("smartstage", split.step, split.dataset, split.summary())
    except NothingToMoveError as e:
        smartstage = ("smartstage", step, raw.prefetch(tf.data.AUTOTUNE), f"kept unsplit: {e.reason}")
    untimed = tf2.split(untimed_step, raw, state=state)
    return [smartstage, ("split_untimed", untimed.step, untimed.dataset, untimed.summary())]


def build_programs(kind: str, files: CriteoFiles, options: Tf2Options) -> KerasPrograms:
    """The programs of one kind, each on its own model built from the same seeds."""
    raw = keras_batches(files, options)
    sample = raw.take(4)
    programs = {}
    model, _, _ = build_model(kind, files, options, sample)
    programs["in_model"] = (raw.prefetch(tf.data.AUTOTUNE), _loss_of(tf.function(model.train_step)))
    _, preprocessing, trainer = build_model(kind, files, options, sample)
    handwritten = raw.map(lambda x, y: (preprocessing(x), y), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).prefetch(tf.data.AUTOTUNE)
    programs["handwritten"] = (handwritten, _loss_of(tf.function(trainer.train_step)))
    model, _, _ = build_model(kind, files, options, sample)
    untimed, _, _ = build_model(kind, files, options, sample)
    notes = {}
    for name, step, dataset, note in smartstage_programs(tf.function(model.train_step),
                                                         tf.function(untimed.train_step), raw, [model, untimed]):
        programs[name] = (dataset, _loss_of(step))
        notes[name] = note
    return KerasPrograms(programs, notes)


__all__ = ["KINDS", "KerasPrograms", "build_model", "build_programs", "keras_batches", "smartstage_programs"]
