"""Models with random layers, for the values-first matrix (tests/tf2/test_fit_defaults.py): each built fresh with
the same seeds and compiled, and datasets that reshuffle each iteration.

    keras3_functional()     Keras 3 functional: StringLookup + Hashing -> Embedding, Dropout, GaussianNoise, Dense
    keras3_sequential()     Keras 3 Sequential on one numeric feature: Normalization (adapted), Dense, Dropout
    keras3_lazy()           Keras 3 subclassed, weights built on the first call, Dropout
    keras3_noisy_step()     Keras 3 functional whose train_step adds keras.random noise from its own SeedGenerator
    tf_keras_functional()   tf_keras functional: StringLookup adapted after construction, Embedding, Dropout
    tf_keras_noisy_step()   tf_keras subclassed with its own train_step drawing tf.random.uniform (no op seed)

Every dataset yields (features, label) batches of fm.BATCH, shuffled in an order its seed fixes: anew each iteration,
or (reshuffle=False) the same order each time, which a trial may read.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
import tf_keras

from tests.tf2 import fit_models as fm

SHUFFLE_SEED = 7


def shuffled(keys=("user", "item", "age"), reshuffle: bool = True) -> tf.data.Dataset:
    """fm's columns in batches, shuffled in an order SHUFFLE_SEED fixes: anew on every iteration (Dataset.shuffle's
    default), or with reshuffle=False the same order every time."""
    x, y = fm.columns()
    rows = tf.data.Dataset.from_tensor_slices(({k: x[k] for k in keys}, y))
    return rows.shuffle(fm.SAMPLES, seed=SHUFFLE_SEED, reshuffle_each_iteration=reshuffle).batch(fm.BATCH)


def shuffled_age(reshuffle: bool = True) -> tf.data.Dataset:
    """(age, label) batches for the Sequential model, shuffled as shuffled() shuffles."""
    x, y = fm.columns()
    rows = tf.data.Dataset.from_tensor_slices((x["age"], y))
    return rows.shuffle(fm.SAMPLES, seed=SHUFFLE_SEED, reshuffle_each_iteration=reshuffle).batch(fm.BATCH)


def csv_dataset(path) -> tf.data.Dataset:
    """make_csv_dataset at its defaults (it shuffles, reshuffling each iteration), one pass over fm's columns."""
    x, y = fm.columns()
    lines = ["user,item,age,label"] + [f"{u[0]},{i[0]},{a[0]:.3f},{int(l[0])}"
                                       for u, i, a, l in zip(x["user"], x["item"], x["age"], y)]
    path.write_text("\n".join(lines) + "\n")
    dataset = tf.data.experimental.make_csv_dataset(str(path), fm.BATCH, label_name="label", num_epochs=1,
                                                    shuffle_seed=SHUFFLE_SEED)
    return dataset.map(lambda f, label: ({"user": f["user"][:, None], "item": f["item"][:, None],
                                          "age": f["age"][:, None]}, tf.cast(label, tf.float32)[:, None]))


def _keras3_inputs():
    return {"user": keras.Input((1,), dtype="string", name="user"),
            "item": keras.Input((1,), dtype="string", name="item"),
            "age": keras.Input((1,), dtype="float32", name="age")}


def _compiled(model: keras.Model, **options) -> keras.Model:
    """A Keras 3 model compiled as every model here is: Adam(0.01), mean squared error, mean absolute error."""
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
                  **options)
    return model


def _embedded_features():
    """The Keras 3 inputs and their features: looked-up user and hashed item embeddings, and the scaled age."""
    inputs = _keras3_inputs()
    user = keras.layers.Embedding(len(fm.USERS) + 1, 4, name="user_embedding")(
        keras.layers.StringLookup(vocabulary=fm.USERS, name="users")(inputs["user"]))
    item = keras.layers.Embedding(16, 4, name="item_embedding")(
        keras.layers.Hashing(num_bins=16, name="items")(inputs["item"]))
    features = keras.layers.Concatenate(name="concat")([keras.layers.Flatten()(user), keras.layers.Flatten()(item),
                                                        inputs["age"] / 80.0])
    return inputs, features


def keras3_functional() -> keras.Model:
    keras.utils.set_random_seed(1)
    inputs, features = _embedded_features()
    hidden = keras.layers.Dropout(0.3, name="dropout")(keras.layers.Dense(8, activation="relu", name="hidden")(
        keras.layers.GaussianNoise(0.1, name="noise")(features)))
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(hidden), name="functional_dropout")
    return _compiled(model)


def keras3_sequential() -> keras.Model:
    keras.utils.set_random_seed(1)
    x, _ = fm.columns()
    normalization = keras.layers.Normalization(name="normalization")
    normalization.adapt(x["age"])
    model = keras.Sequential([keras.Input((1,)), normalization, keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(1)], name="sequential_dropout")
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


class LazyRanker(keras.Model):
    """Keras 3 subclassed: its Dense layers build their weights on the first call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.users = keras.layers.StringLookup(vocabulary=fm.USERS, output_mode="one_hot", name="users")
        self.items = keras.layers.Hashing(num_bins=8, output_mode="one_hot", name="items")
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.dropout = keras.layers.Dropout(0.25, name="dropout")
        self.score = keras.layers.Dense(1, name="score")

    def call(self, x, training=False):
        features = keras.ops.concatenate([self.users(x["user"][:, 0]), self.items(x["item"][:, 0]),
                                          x["age"] / 80.0], 1)
        return self.score(self.dropout(self.hidden(features), training=training))


def keras3_lazy() -> keras.Model:
    keras.utils.set_random_seed(1)
    model = LazyRanker(name="lazy_ranker")
    return _compiled(model)


class NoisyStep(keras.Model):
    """A functional model whose train_step perturbs the labels with noise from its own SeedGenerator."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise_seed = keras.random.SeedGenerator(3)

    def train_step(self, data):
        x, y = data
        y = y + 0.01 * keras.random.normal(keras.ops.shape(y), seed=self.noise_seed)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, self(x, training=False))
        return {m.name: m.result() for m in self.metrics}


def keras3_noisy_step() -> keras.Model:
    keras.utils.set_random_seed(1)
    inputs = _keras3_inputs()
    features = keras.layers.Concatenate(name="concat")([
        keras.layers.StringLookup(vocabulary=fm.USERS, output_mode="one_hot", name="users")(inputs["user"]),
        keras.layers.Hashing(num_bins=8, output_mode="one_hot", name="items")(inputs["item"]), inputs["age"]])
    hidden = keras.layers.Dropout(0.2)(keras.layers.Dense(8, activation="relu", name="hidden")(features))
    model = NoisyStep(inputs, keras.layers.Dense(1, name="score")(hidden), name="noisy_step")
    return _compiled(model)


def tf_keras_functional() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    x, _ = fm.columns()
    users = tf_keras.layers.StringLookup(name="users")
    users.adapt(x["user"])  # adapted after construction: tf_keras tracks its vocabulary among the weights
    inputs = {"user": tf_keras.Input((1,), dtype=tf.string, name="user"),
              "item": tf_keras.Input((1,), dtype=tf.string, name="item"),
              "age": tf_keras.Input((1,), name="age")}
    user = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(8, 4, name="user_embedding")(users(inputs["user"])))
    item = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(16, 4, name="item_embedding")(
        tf_keras.layers.Hashing(num_bins=16, name="items")(inputs["item"])))
    hidden = tf_keras.layers.Dense(8, activation="relu", name="hidden")(
        tf_keras.layers.Concatenate()([user, item, inputs["age"] / 80.0]))
    output = tf_keras.layers.Dense(1, name="score")(tf_keras.layers.Dropout(0.3)(hidden))
    model = tf_keras.Model(inputs, output, name="tf_keras_adapted")
    model.compile(tf_keras.optimizers.Adam(0.01), "mse", metrics=[tf_keras.metrics.MeanAbsoluteError(name="mae")])
    return model


class NoisyTwoTower(fm.TwoTower):
    """fm.TwoTower whose train_step adds tf.random.uniform noise (no op seed) to the labels."""

    def train_step(self, data):
        x, y = data
        return super().train_step((x, y + 0.01 * tf.random.uniform(tf.shape(y))))


def tf_keras_noisy_step() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    model = NoisyTwoTower()
    model.compile(tf_keras.optimizers.SGD(0.1), "mse", metrics=[tf_keras.metrics.MeanAbsoluteError(name="mae")])
    return model


MODELS = {"keras3_functional": (keras3_functional, shuffled),
          "keras3_sequential": (keras3_sequential, shuffled_age),
          "keras3_lazy": (keras3_lazy, shuffled),
          "keras3_noisy_step": (keras3_noisy_step, shuffled),
          "tf_keras_functional": (tf_keras_functional, shuffled),
          "tf_keras_noisy_step": (tf_keras_noisy_step, lambda reshuffle=True: shuffled(("user", "item"), reshuffle))}


def unshuffled(name: str) -> tf.data.Dataset:
    """The model's evaluation data: the same batches in file order."""
    if name == "keras3_sequential":
        x, y = fm.columns(seed=4)
        return tf.data.Dataset.from_tensor_slices((x["age"], y)).batch(fm.BATCH)
    keys = ("user", "item") if name == "tf_keras_noisy_step" else ("user", "item", "age")
    return fm.dataset(keys, seed=4)


def predictions(model, dataset: tf.data.Dataset) -> np.ndarray:
    return np.asarray(model.predict(dataset.map(lambda x, y: x), verbose=0))


class EagerRecorder(keras.layers.Layer):
    """An identity layer that records, for each training call, whether it ran eagerly."""

    calls: list = []

    def call(self, x, training=None):
        if training:
            type(self).calls.append(tf.executing_eagerly())
        return x


def keras3_eager() -> keras.Model:
    """A Keras 3 functional model with stock steps, compiled with run_eagerly=True, whose EagerRecorder layer
    (on the main side, after the first Dense) records how it runs."""
    keras.utils.set_random_seed(1)
    inputs, features = _embedded_features()
    hidden = EagerRecorder(name="recorder")(keras.layers.Dense(8, activation="relu", name="hidden")(features))
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(keras.layers.Dropout(0.3)(hidden)),
                        name="eager_functional")
    EagerRecorder.calls = []
    return _compiled(model, run_eagerly=True)
