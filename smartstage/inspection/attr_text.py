"""Attribute values as short readable text, for diffs and reports.

    attr_text(AttrValue(type=DT_INT64))             -> "int64"
    attr_text(AttrValue(list=...(type=[INT64, STRING]))) -> "[int64, string]"
    attr_text(<a scalar int32 tensor 0>)            -> "tensor<int32 [] 0>"
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2

from smartstage.graph.op_types import dtype_name

MAX_VALUE_CHARS = 120


def attr_text(value: attr_value_pb2.AttrValue | None) -> str | None:
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "type":
        text = dtype_name(value.type)
    elif kind == "shape":
        text = _shape_text(value.shape)
    elif kind == "list":
        lst = value.list
        parts = ([dtype_name(t) for t in lst.type] or [_shape_text(s) for s in lst.shape]
                 or [repr(s.decode("utf-8", "replace")) for s in lst.s] or [str(i) for i in lst.i]
                 or [repr(f) for f in lst.f] or [str(b).lower() for b in lst.b] or [f.name for f in lst.func])
        text = "[" + ", ".join(parts) + "]"
    elif kind == "s":
        text = repr(value.s.decode("utf-8", "replace"))
    elif kind == "i":
        text = str(value.i)
    elif kind == "f":
        text = repr(value.f)
    elif kind == "b":
        text = str(value.b).lower()
    elif kind == "tensor":
        text = _tensor_text(value.tensor)
    elif kind == "func":
        text = f"func {value.func.name}"
    elif kind == "placeholder":
        text = f"${value.placeholder}"
    else:
        text = ""
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _tensor_text(tensor) -> str:
    head = f"{dtype_name(tensor.dtype)} {_shape_text(tensor.tensor_shape)}"
    try:
        from tensorflow.python.framework import tensor_util

        array = tensor_util.MakeNdarray(tensor)
    except Exception:  # a dtype numpy cannot hold (resource, variant): the type says enough
        return f"tensor<{head}>"
    if array.size > 8:
        return f"tensor<{head}>"
    values = array.tolist()
    if isinstance(values, bytes):
        values = values.decode("utf-8", "replace")
    return f"tensor<{head} {values!r}>"


def _shape_text(shape) -> str:
    if shape.unknown_rank:
        return "<unknown>"
    return "[" + ",".join("?" if d.size < 0 else str(d.size) for d in shape.dim) + "]"
