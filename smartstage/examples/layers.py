"""Seeded layers of the example models: embedding tables, dense layers, MLPs.

Every variable is a `tf.compat.v1.get_variable` with an initializer whose op-level seed comes
from a `Seeds` counter, so two builds with the same seed start from the same weights.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from smartstage.examples.features import CategoricalInput


class Seeds:
    """Hands out op-level seeds 1, 2, 3, ... after a base seed, in build order."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._count = 0

    def next(self) -> int:
        """The next op-level seed."""
        self._count += 1
        return self._base * 1000 + self._count


def embedding_table(name: str, num_ids: int, dim: int, seeds: Seeds) -> tf.Variable:
    """A [num_ids, dim] embedding variable, uniform in +-0.05."""
    init = tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=seeds.next())
    return tf.compat.v1.get_variable(name, shape=[num_ids, dim], initializer=init)


def embed(table: tf.Variable, feature: CategoricalInput, combiner: str = "mean") -> tf.Tensor:
    """[B, dim] embeddings: a gather for dense ids, safe_embedding_lookup_sparse for sparse ids."""
    if feature.sparse_ids is not None:
        return tf.nn.safe_embedding_lookup_sparse(
            table, feature.sparse_ids, combiner=combiner, name=f"embed_{feature.name}"
        )
    return tf.nn.embedding_lookup(table, feature.ids, name=f"embed_{feature.name}")


def dense_layer(
    x: tf.Tensor,
    units: int,
    name: str,
    seeds: Seeds,
    activation: Optional[Callable[[tf.Tensor], tf.Tensor]] = tf.nn.relu,
) -> tf.Tensor:
    """x @ kernel + bias, then `activation` (None for a linear layer)."""
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "kernel", shape=[x.shape[-1], units], initializer=tf.compat.v1.glorot_uniform_initializer(seed=seeds.next())
        )
        bias = tf.compat.v1.get_variable("bias", shape=[units], initializer=tf.compat.v1.zeros_initializer())
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        return activation(y) if activation is not None else y


def mlp(x: tf.Tensor, widths: Sequence[int], name: str, seeds: Seeds, *, last_activation: bool = True) -> tf.Tensor:
    """Dense layers of `widths` with ReLU; the last one linear unless `last_activation`."""
    with tf.compat.v1.variable_scope(name):
        for k, units in enumerate(widths):
            last = k == len(widths) - 1
            x = dense_layer(x, units, f"layer{k}", seeds, tf.nn.relu if (last_activation or not last) else None)
    return x
