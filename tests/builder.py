"""A tiny GraphDef builder for hand-drawn test graphs.

    g = G(N("x", "Placeholder", dtype=tf.float32),
          N("y", "Identity", ["x"], T=tf.float32))

Attribute values are converted by type: DType -> type, [DType] -> list(type), bool -> b, int -> i,
float -> f, str/bytes -> s, TensorShape/list of dims under the key "shape" -> shape, numpy/list values
under "value" -> tensor.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2


def _attr(key, value) -> attr_value_pb2.AttrValue:
    if isinstance(value, attr_value_pb2.AttrValue):
        return value
    if isinstance(value, tf.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, tf.DType) for v in value):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=[v.as_datatype_enum for v in value]))
    if key in ("shape",) or isinstance(value, tf.TensorShape):
        return attr_value_pb2.AttrValue(shape=tf.TensorShape(value).as_proto())
    if key == "value":
        return attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(np.asarray(value)))
    if key == "shapes":
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=[tf.TensorShape(s).as_proto() for s in value]))
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, float):
        return attr_value_pb2.AttrValue(f=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    if isinstance(value, bytes):
        return attr_value_pb2.AttrValue(s=value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, bytes)) for v in value):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=[v.encode() if isinstance(v, str) else v for v in value]))
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(i=list(value)))
    raise TypeError(f"builder: cannot turn attr {key}={value!r} into an AttrValue")


def N(name: str, op: str, inputs=(), device: str = "", **attrs) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs), device=device)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(_attr(key, value))
    return node


def G(*nodes: node_def_pb2.NodeDef) -> graph_pb2.GraphDef:
    g = graph_pb2.GraphDef()
    g.node.extend(nodes)
    return g


def names(graph_def) -> list[str]:
    return [n.name for n in graph_def.node]


def node(graph_def, name: str) -> node_def_pb2.NodeDef:
    return next(n for n in graph_def.node if n.name == name)
