"""Models of every kind that ss.tf2.fit trains, each built fresh with the same seeds and compiled, and their data.

    ctr_tf_keras()            tf_keras functional: DenseFeatures (hashed categorical columns -> embedding columns,
                              a numeric column) + SequenceFeatures (a hashed click sequence) -> Dense
    ranking_tf_keras()        tf_keras subclassed: StringLookup(user), StringLookup(item) -> Embedding -> dot + Dense
    keras3_subclassed()       Keras 3 subclassed: Hashing + StringLookup -> Embedding -> Dense
    keras3_feature_space()    Keras 3 functional over a FeatureSpace (hashed, string-categorical, normalized float)
    custom_step_keras3()      Keras 3 functional whose class overrides train_step (clips the gradients)
    custom_step_tf_keras()    tf_keras subclassed with its own train_step (clips gradient norms) and test_step

Every dataset is (features, label) or (features, label, weight), batches of BATCH, not shuffled.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
import tf_keras

SAMPLES, BATCH = 48, 8
USERS, ITEMS = ["u1", "u2", "u3", "u4"], ["i1", "i2", "i3", "i4", "i5"]


def columns(samples: int = SAMPLES, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = {"user": rng.choice(USERS + ["u9"], (samples, 1)), "item": rng.choice(ITEMS + ["i9"], (samples, 1)),
         "age": rng.uniform(10, 80, (samples, 1)).astype("float32"),
         "clicks": np.where(rng.uniform(size=(samples, 4)) < 0.3, "", rng.choice(ITEMS, (samples, 4)))}
    y = (rng.uniform(size=(samples, 1)) < 0.4).astype("float32")
    return x, y


def dataset(keys=("user", "item", "age", "clicks"), samples: int = SAMPLES, seed: int = 0,
            weights: bool = False, shuffle_seed: int | None = None) -> tf.data.Dataset:
    """Batches of (the `keys` columns, label[, weight]); with `shuffle_seed`, shuffled anew each epoch in an
    order that seed fixes."""
    x, y = columns(samples, seed)
    x = {k: x[k] for k in keys}
    parts = (x, y, np.linspace(0.5, 1.5, samples).astype("float32")[:, None]) if weights else (x, y)
    rows = tf.data.Dataset.from_tensor_slices(parts)
    if shuffle_seed is not None:
        rows = rows.shuffle(samples, seed=shuffle_seed, reshuffle_each_iteration=True)
    return rows.batch(BATCH)


def ctr_tf_keras(steps_per_execution: int = 1) -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    fc = tf.feature_column
    user = fc.embedding_column(fc.categorical_column_with_hash_bucket("user", 16), 4)
    item = fc.embedding_column(fc.categorical_column_with_hash_bucket("item", 16), 4)
    age = fc.bucketized_column(fc.numeric_column("age"), [20.0, 40.0, 60.0])
    clicks = fc.embedding_column(fc.sequence_categorical_column_with_hash_bucket("clicks", 16), 4)
    inputs = {"user": tf_keras.Input((1,), dtype=tf.string, name="user"),
              "item": tf_keras.Input((1,), dtype=tf.string, name="item"),
              "age": tf_keras.Input((1,), name="age"),
              "clicks": tf_keras.Input((4,), dtype=tf.string, name="clicks")}
    dense = tf_keras.layers.DenseFeatures([user, item, age], name="dense_features")(inputs)
    sequence, _ = tf_keras.experimental.SequenceFeatures([clicks], name="sequence_features")(
        {"clicks": inputs["clicks"]})
    pooled = tf_keras.layers.GlobalAveragePooling1D(name="pool")(sequence)
    hidden = tf_keras.layers.Dense(8, activation="relu", name="hidden")(
        tf_keras.layers.Concatenate(name="concat")([dense, pooled]))
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(1, activation="sigmoid", name="ctr")(hidden), name="ctr")
    model.compile(tf_keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=[tf_keras.metrics.AUC(name="auc")],
                  weighted_metrics=[tf_keras.metrics.BinaryAccuracy(name="accuracy")],
                  steps_per_execution=steps_per_execution)
    return model


class Ranking(tf_keras.Model):
    def __init__(self):
        super().__init__(name="ranking")
        self.users = tf_keras.layers.StringLookup(vocabulary=USERS, name="users")
        self.items = tf_keras.layers.StringLookup(vocabulary=ITEMS, name="items")
        self.user_embedding = tf_keras.layers.Embedding(len(USERS) + 1, 4, name="user_embedding")
        self.item_embedding = tf_keras.layers.Embedding(len(ITEMS) + 1, 4, name="item_embedding")
        self.score = tf_keras.layers.Dense(1, name="score")

    def call(self, x):
        u = self.user_embedding(self.users(x["user"][:, 0]))
        i = self.item_embedding(self.items(x["item"][:, 0]))
        return self.score(tf.concat([u * i, u, i], 1))


def ranking_tf_keras(steps_per_execution: int = 1) -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    model = Ranking()
    model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.MeanSquaredError(),
                  metrics=[tf_keras.metrics.MeanAbsoluteError(name="mae")],
                  weighted_metrics=[tf_keras.metrics.MeanSquaredError(name="weighted_mse")],
                  steps_per_execution=steps_per_execution)
    return model


class Keras3Ranker(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.users = keras.layers.StringLookup(vocabulary=USERS, name="users")
        self.items = keras.layers.Hashing(num_bins=16, name="items")
        self.user_embedding = keras.layers.Embedding(len(USERS) + 1, 4, name="user_embedding")
        self.item_embedding = keras.layers.Embedding(16, 4, name="item_embedding")
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.score = keras.layers.Dense(1, name="score")

    def call(self, x):
        u = self.user_embedding(self.users(x["user"][:, 0]))
        i = self.item_embedding(self.items(x["item"][:, 0]))
        return self.score(self.hidden(keras.ops.concatenate([u, i, x["age"] / 80.0], 1)))


def keras3_subclassed(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(1)
    model = Keras3Ranker(name="keras3_ranker")
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
                  weighted_metrics=[keras.metrics.MeanSquaredError(name="weighted_mse")],
                  steps_per_execution=steps_per_execution)
    return model


def keras3_feature_space() -> keras.Model:
    keras.utils.set_random_seed(1)
    x, _ = columns()
    space = keras.utils.FeatureSpace(
        features={"user": keras.utils.FeatureSpace.string_categorical(num_oov_indices=1),
                  "item": keras.utils.FeatureSpace.string_hashed(num_bins=16),
                  "age": keras.utils.FeatureSpace.float_normalized()},
        output_mode="concat")
    space.adapt(tf.data.Dataset.from_tensor_slices({k: x[k] for k in ("user", "item", "age")}).batch(BATCH))
    inputs = space.get_inputs()
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(space.get_encoded_features())
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(hidden), name="feature_space_model")
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
    return model


class ClippedModel(keras.Model):
    """A functional model whose class overrides train_step: gradients clipped by value before the update."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = [tf.clip_by_value(g, -0.05, 0.05) for g in tape.gradient(loss, self.trainable_variables)]
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, self(x, training=False))
        return {m.name: m.result() for m in self.metrics}


def custom_step_keras3() -> keras.Model:
    keras.utils.set_random_seed(1)
    user = keras.Input((1,), dtype="string", name="user")
    item = keras.Input((1,), dtype="string", name="item")
    features = keras.layers.Concatenate(name="concat")([
        keras.layers.StringLookup(vocabulary=USERS, output_mode="one_hot", name="users")(user),
        keras.layers.Hashing(num_bins=8, output_mode="one_hot", name="items")(item)])
    output = keras.layers.Dense(1, name="score")(keras.layers.Dense(8, activation="relu", name="hidden")(features))
    model = ClippedModel({"user": user, "item": item}, output, name="clipped")
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
    return model


class TwoTower(tf_keras.Model):
    """A tf_keras subclassed model with its own train_step and test_step."""

    def __init__(self):
        super().__init__(name="two_tower")
        self.users = tf_keras.layers.Hashing(num_bins=8, name="users")
        self.items = tf_keras.layers.StringLookup(vocabulary=ITEMS, name="items")
        self.user_embedding = tf_keras.layers.Embedding(8, 4, name="user_embedding")
        self.item_embedding = tf_keras.layers.Embedding(len(ITEMS) + 1, 4, name="item_embedding")
        self.score = tf_keras.layers.Dense(1, name="score")

    def call(self, x):
        u = self.user_embedding(self.users(x["user"][:, 0]))
        i = self.item_embedding(self.items(x["item"][:, 0]))
        return self.score(u * i)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            prediction = self(x, training=True)
            loss = self.compiled_loss(y, prediction, regularization_losses=self.losses)
        grads = [tf.clip_by_norm(g, 0.5) for g in tape.gradient(loss, self.trainable_variables)]
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.compiled_metrics.update_state(y, prediction)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        prediction = self(x, training=False)
        self.compiled_loss(y, prediction, regularization_losses=self.losses)
        self.compiled_metrics.update_state(y, prediction)
        return {m.name: m.result() for m in self.metrics}


def custom_step_tf_keras() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    model = TwoTower()
    model.compile(tf_keras.optimizers.SGD(0.1), "mse", metrics=[tf_keras.metrics.MeanAbsoluteError(name="mae")])
    return model
