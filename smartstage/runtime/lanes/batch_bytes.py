"""A batch's bytes in a handful of ops, whatever the number of tensors the stage carries.

    before:  Size, Const, Mul per tensor (+ StringLength, Cast, Sum, AddV2 per string): ops linear in the
             number of tensors the stage carries, built into every executor that reads them
    after:   one ShapeN, Pack, Prod, Sum, Mul per (dtype, rank) of the tensors whose shape is not static,
             one constant for the static ones, 3 ops per string tensor

The bytes feed the tuner's capacity cap only, but the ops sit in the fetch lists of the lanes' body and of the
one-lane put, so every session builds them (TensorFlow builds executors per session, node by node): their
count must not grow with the tensors a stage carries. The number is the same as counting tensor by tensor:
elements x element size, a string counted as its length + 8.
"""

from __future__ import annotations

import tensorflow as tf

from smartstage.graph.op_types import UNFEEDABLE_DTYPES

STRING_OVERHEAD = 8  # bytes counted per string element besides its characters


def _width(dtype: tf.DType) -> int:
    return STRING_OVERHEAD if dtype == tf.string else dtype.size


def bytes_of_batch(components: list[tf.Tensor]) -> tf.Tensor:
    """An int64 scalar: the bytes of `components` (resource and variant tensors count 0).

        before:  [a: float32 (None, 4), b: int64 (2,), s: string (None,)]
        after:   16 * rows(a) + 16 + 8 * len(s) + the lengths of s's strings (one ShapeN per dtype and rank)
    """
    static = 0
    dynamic: dict[tuple[tf.DType, int], list[tf.Tensor]] = {}
    parts: list[tf.Tensor] = []
    for tensor in components:
        dtype = tensor.dtype.base_dtype
        if dtype.as_datatype_enum in UNFEEDABLE_DTYPES:
            continue
        if dtype == tf.string:
            parts.append(tf.reduce_sum(tf.cast(tf.strings.length(tensor), tf.int64)))
        shape = tensor.shape
        if shape.is_fully_defined():
            static += shape.num_elements() * _width(dtype)
        elif shape.rank is None:  # no rank: its shape cannot be stacked with others
            parts.append(tf.size(tensor, out_type=tf.int64) * _width(dtype))
        else:
            dynamic.setdefault((dtype, shape.rank), []).append(tensor)
    for (dtype, _rank), tensors in dynamic.items():
        shapes = tf.stack(tf.shape_n(tensors, out_type=tf.int64))  # (tensors, rank): one ShapeN for all
        parts.append(tf.reduce_sum(tf.reduce_prod(shapes, axis=1)) * _width(dtype))
    if static or not parts:
        parts.append(tf.constant(static, tf.int64))
    return tf.add_n(parts) if len(parts) > 1 else tf.identity(parts[0])


__all__ = ["STRING_OVERHEAD", "bytes_of_batch"]
