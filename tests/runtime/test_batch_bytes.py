"""bytes_of_batch (runtime/lanes/batch_bytes.py): the bytes of a batch, counted as before (elements x element
size, a string as its length + 8), in a number of ops that does not grow with the float and int tensors.

    a: float32 (None, 4) --\\
    b: int64 (2,) const ----+--> bytes_of_batch --> one int64 scalar
    s: string (None,) ------+
    u: int32, no shape -----/
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from smartstage.runtime.lanes.batch_bytes import bytes_of_batch


def _placeholders(graph: tf.Graph):
    with graph.as_default():
        return {
            "a": tf.compat.v1.placeholder(tf.float32, [None, 4], name="a"),
            "c": tf.compat.v1.placeholder(tf.float32, [None, 4], name="c"),
            "d": tf.compat.v1.placeholder(tf.int64, [None, 2], name="d"),
            "s": tf.compat.v1.placeholder(tf.string, [None], name="s"),
            "u": tf.compat.v1.placeholder(tf.int32, None, name="u"),
            "r": tf.compat.v1.placeholder(tf.resource, [], name="r"),
        }


VALUES = {"a": np.zeros([3, 4], np.float32), "c": np.zeros([1, 4], np.float32), "d": np.zeros([7, 2], np.int64),
          "s": np.array([b"ab", b"", b"xyz"]), "u": np.zeros([2, 5], np.int32)}

CASES = [  # (tensors, expected bytes written out)
    (["a"], 3 * 4 * 4),
    (["a", "c"], 3 * 4 * 4 + 1 * 4 * 4),            # one ShapeN for both
    (["d"], 7 * 2 * 8),
    (["s"], (2 + 0 + 3) + 8 * 3),                    # lengths + 8 per string
    (["u"], 2 * 5 * 4),                              # no rank: counted alone
    (["b"], 2 * 8),                                  # a static shape: a constant
    (["a", "b", "s", "u", "c", "d"], 48 + 16 + 29 + 40 + 16 + 112),
    ([], 0),
]


@pytest.mark.parametrize("names, expected", CASES)
def test_bytes_of_batch_counts_every_element(names, expected):
    graph = tf.Graph()
    tensors = _placeholders(graph)
    with graph.as_default():
        tensors["b"] = tf.constant([3, 4], tf.int64, name="b")
        total = bytes_of_batch([tensors[n] for n in names])
        with tf.compat.v1.Session() as sess:
            got = sess.run(total, {tensors[n]: VALUES[n] for n in names if n in VALUES})
    assert total.dtype == tf.int64
    assert int(got) == expected


def test_resource_tensors_count_nothing():
    graph = tf.Graph()
    tensors = _placeholders(graph)
    with graph.as_default():
        total = bytes_of_batch([tensors["r"], tensors["a"]])
        with tf.compat.v1.Session() as sess:
            assert int(sess.run(total, {tensors["a"]: VALUES["a"]})) == 48


def test_the_ops_do_not_grow_with_the_tensors_of_one_dtype_and_rank():
    # 200 dynamic float32 (None, 3) tensors: one ShapeN group; the per-tensor count took 3 ops each (600)
    graph = tf.Graph()
    with graph.as_default():
        tensors = [tf.compat.v1.placeholder(tf.float32, [None, 3]) for _ in range(200)]
        before = len(graph.get_operations())
        total = bytes_of_batch(tensors)
        added = len(graph.get_operations()) - before
        with tf.compat.v1.Session() as sess:
            got = sess.run(total, {t: np.zeros([i % 5, 3], np.float32) for i, t in enumerate(tensors)})
    assert added <= 10, added
    assert int(got) == sum(i % 5 for i in range(200)) * 3 * 4
