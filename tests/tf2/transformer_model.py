"""A small tf_keras model of the keras-io Behavior Sequence Transformer's shape, and its data, read as the
example reads its CSV file: each row's movie ids and ratings are one comma-separated string, split in the
dataset, so every batch dimension is unknown in the dataset's element_spec.

    ids -> StringLookup -> Embedding (+ position embedding, x rating) -> MultiHeadAttention (dropout) -> Dropout
    -> Add -> LayerNormalization -> LeakyReLU -> Dense -> Dropout -> Add -> LayerNormalization -> Flatten,
    concat user features (StringLookup -> Embedding) -> [Dense -> BatchNormalization -> LeakyReLU -> Dropout] x 2
    -> Dense(1): the target movie's rating; mean squared error, Adagrad, mean absolute error as metric

    model = behavior_sequence_transformer(); ds = rating_dataset()
    for batch in ds: model.train_step(batch)          # {"loss": ..., "mean_absolute_error": ...}
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
import tf_keras

MOVIES = [f"movie_{i}" for i in range(40)]
USERS = [f"user_{i}" for i in range(10)]
SEXES = ["F", "M"]
SEQUENCE = 4  # movies per row: the first three rated in order, then the target
# A batch of 20 rows (not a power of two): a mean's gradient divides by 20, which multiplying by a rounded
# 1/20 does not reproduce in every bit (tests/tf2/test_split_transformer.py).
SAMPLES, BATCH = 200, 20


def rating_rows(samples: int = SAMPLES, seed: int = 0) -> dict:
    """The example's CSV columns: user, sex, and the movie ids and ratings of each row as "a,b,c,d" strings."""
    rng = np.random.default_rng(seed)
    movies = rng.choice(MOVIES, (samples, SEQUENCE))
    ratings = rng.integers(1, 6, (samples, SEQUENCE))
    return {"user_id": rng.choice(USERS, samples), "sex": rng.choice(SEXES, samples),
            "sequence_movie_ids": np.array([",".join(row) for row in movies]),
            "sequence_ratings": np.array([",".join(str(r) for r in row) for row in ratings])}


def split_sequences(features: dict) -> tuple[dict, tf.Tensor]:
    """The example's dataset map: the last movie of each sequence is the target, its rating the label."""
    features = dict(features)
    movies = tf.strings.split(features["sequence_movie_ids"], ",").to_tensor()
    ratings = tf.strings.to_number(tf.strings.split(features["sequence_ratings"], ","), tf.float32).to_tensor()
    features["target_movie_id"] = movies[:, -1]
    features["sequence_movie_ids"] = movies[:, :-1]
    features["sequence_ratings"] = ratings[:, :-1]
    return features, ratings[:, -1]


def rating_dataset(samples: int = SAMPLES, seed: int = 0, drop_remainder: bool = False) -> tf.data.Dataset:
    """Batches of (features, rating) in a fixed order; their shapes are unknown in the element_spec unless
    drop_remainder=True fixes the batch dimension (the sequence length stays unknown either way)."""
    rows = tf.data.Dataset.from_tensor_slices(rating_rows(samples, seed))
    return rows.batch(BATCH, drop_remainder=drop_remainder).map(split_sequences)


def _lookup_embedding(vocabulary: list[str], name: str) -> tuple:
    lookup = tf_keras.layers.StringLookup(vocabulary=vocabulary, mask_token=None, num_oov_indices=0,
                                          name=f"{name}_lookup")
    return lookup, tf_keras.layers.Embedding(len(vocabulary), int(math.sqrt(len(vocabulary))), name=f"{name}_embedding")


def behavior_sequence_transformer(dropout: float = 0.1, batch_norm: bool = True, seed: int = 1) -> tf_keras.Model:
    """The model, built from `seed` (two calls give the same weights), compiled as the example compiles it.
    batch_norm=False leaves out the BatchNormalization of the two hidden layers."""
    tf_keras.utils.set_random_seed(seed)
    layers = tf_keras.layers
    inputs = {"user_id": layers.Input((1,), dtype=tf.string, name="user_id"),
              "sex": layers.Input((1,), dtype=tf.string, name="sex"),
              "sequence_movie_ids": layers.Input((SEQUENCE - 1,), dtype=tf.string, name="sequence_movie_ids"),
              "sequence_ratings": layers.Input((SEQUENCE - 1,), name="sequence_ratings"),
              "target_movie_id": layers.Input((1,), dtype=tf.string, name="target_movie_id")}
    users = []
    for name, vocabulary in (("user_id", USERS), ("sex", SEXES)):
        lookup, embedding = _lookup_embedding(vocabulary, name)
        users.append(embedding(lookup(inputs[name])))
    users = layers.concatenate(users)

    movie_lookup, movie_embedding = _lookup_embedding(MOVIES, "movie")
    dims = movie_embedding.output_dim
    target = movie_embedding(movie_lookup(inputs["target_movie_id"]))
    sequence = movie_embedding(movie_lookup(inputs["sequence_movie_ids"]))
    positions = layers.Embedding(SEQUENCE, dims, name="position_embedding")(tf.range(0, SEQUENCE - 1, 1))
    ratings = tf.expand_dims(inputs["sequence_ratings"], -1)
    sequence = layers.Multiply()([sequence + positions, ratings])
    features = layers.concatenate([tf.expand_dims(m, 1) for m in tf.unstack(sequence, axis=1)] + [target], axis=1)

    attention = layers.MultiHeadAttention(num_heads=3, key_dim=dims, dropout=dropout)(features, features)
    x1 = layers.LayerNormalization()(layers.Add()([features, layers.Dropout(dropout)(attention)]))
    x2 = layers.Dropout(dropout)(layers.Dense(dims)(layers.LeakyReLU()(x1)))
    features = layers.Flatten()(layers.LayerNormalization()(layers.Add()([x1, x2])))
    features = layers.concatenate([features, layers.Reshape([users.shape[-1]])(users)])
    for units in (16, 8):
        features = layers.Dense(units)(features)
        if batch_norm:
            features = layers.BatchNormalization()(features)
        features = layers.Dropout(dropout)(layers.LeakyReLU()(features))
    model = tf_keras.Model(inputs, layers.Dense(1)(features), name="behavior_sequence_transformer")
    model.compile(optimizer=tf_keras.optimizers.Adagrad(learning_rate=0.01),
                  loss=tf_keras.losses.MeanSquaredError(), metrics=[tf_keras.metrics.MeanAbsoluteError()])
    return model
