"""A Keras 3 functional model with its preprocessing inside, built fresh with the same seeds each time.

    raw {"city": b"paris", "tag": b"t3", "age": 37.0, "income": 4.2}
      city -> StringLookup(multi_hot)      tag -> Hashing(8, multi_hot)
      age -> Discretization -> CategoryEncoding(multi_hot)     income -> Normalization (adapted)
      -> Concatenate -> Dense(8, relu) -> Dense(1)             (the Dense layers train; the rest can move)
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

CITIES = ["paris", "rome", "oslo"]
SAMPLES = 64
BATCH = 8


def raw_arrays(samples: int = SAMPLES, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = {"city": rng.choice(CITIES + ["lima"], (samples, 1)), "tag": rng.choice(["t1", "t2", "t3"], (samples, 1)),
         "age": rng.uniform(10, 80, (samples, 1)).astype("float32"),
         "income": rng.normal(5, 2, (samples, 1)).astype("float32")}
    y = (x["age"][:, 0] / 80 + rng.normal(0, 0.1, samples)).astype("float32")[:, None]
    return x, y


def raw_dataset(samples: int = SAMPLES, seed: int = 0) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(raw_arrays(samples, seed)).batch(BATCH)


def preprocessing_model(learning_rate: float = 0.01) -> keras.Model:
    """A fresh compiled model; every call gives the same initial weights."""
    keras.utils.set_random_seed(1)
    x, _ = raw_arrays()
    city = keras.Input(shape=(1,), dtype="string", name="city")
    tag = keras.Input(shape=(1,), dtype="string", name="tag")
    age = keras.Input(shape=(1,), dtype="float32", name="age")
    income = keras.Input(shape=(1,), dtype="float32", name="income")
    normalization = keras.layers.Normalization(axis=None, name="income_norm")
    normalization.adapt(x["income"])
    features = [
        keras.layers.StringLookup(vocabulary=CITIES, output_mode="multi_hot", name="city_lookup")(city),
        keras.layers.Hashing(num_bins=8, output_mode="multi_hot", name="tag_hash")(tag),
        keras.layers.CategoryEncoding(num_tokens=4, output_mode="multi_hot", name="age_bucket")(
            keras.layers.Discretization(bin_boundaries=[20.0, 40.0, 60.0], name="age_bins")(age)),
        normalization(income),
    ]
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(keras.layers.Concatenate(name="concat")(features))
    output = keras.layers.Dense(1, name="score")(hidden)
    model = keras.Model({"city": city, "tag": tag, "age": age, "income": income}, output, name="ranker")
    model.compile(keras.optimizers.Adam(learning_rate), "mse", metrics=["mae"])
    return model


