"""Kernels and memory types: which kernel stock TensorFlow runs a node with, and where it keeps each tensor.

    kernel_for(node, "GPU")        # the KernelDef stock TensorFlow would run it with on a GPU, or None
    has_kernel(node, "CPU")        # True / False; None when the op type is unknown to this TensorFlow
    input_memory(node, 1, "GPU")   # "host" (e.g. Reshape's shape) or "device"

The kernel registry of the installed TensorFlow is the CUDA build's (GPU kernels are registered even on a
machine without a GPU), so "has a GPU kernel" and "reads this input in host memory" are answered the way
the placer and the executor of a GPU machine would answer them, for the node's own attribute values.
Nothing here edits a graph.
"""

from __future__ import annotations

import functools
from typing import Mapping

from tensorflow.core.framework import attr_value_pb2, kernel_def_pb2, node_def_pb2, types_pb2

from smartstage.graph.op_types import op_def
from smartstage.passes.gpu.devices import CPU, GPU

DEFAULT = "DEFAULT"
HOST = "host"
DEVICE = "device"

# DataTypeAlwaysOnHost in stock TensorFlow: these never live in device memory, whatever the kernel says.
ALWAYS_ON_HOST = frozenset({types_pb2.DT_STRING, types_pb2.DT_STRING_REF, types_pb2.DT_RESOURCE,
                            types_pb2.DT_RESOURCE_REF})


@functools.lru_cache(maxsize=None)
def registered_kernels(op_type: str) -> tuple[kernel_def_pb2.KernelDef, ...]:
    """Every KernelDef the installed TensorFlow registers for `op_type` (all device types)."""
    from tensorflow.python.framework import kernels

    try:
        return tuple(kernels.get_registered_kernels_for_op(op_type).kernel)
    except Exception:  # an op type this TensorFlow does not know
        return ()


def _attrs_with_defaults(node: node_def_pb2.NodeDef) -> dict[str, attr_value_pb2.AttrValue]:
    attrs = dict(node.attr)
    od = op_def(node.op)
    if od is not None:
        for a in od.attr:
            if a.name not in attrs and a.HasField("default_value"):
                attrs[a.name] = a.default_value
    return attrs


def _constraint_holds(constraint, attrs: Mapping[str, attr_value_pb2.AttrValue]) -> bool:
    value = attrs.get(constraint.name)
    if value is None:
        return False
    allowed = constraint.allowed_values.list
    kind = value.WhichOneof("value")
    if kind == "type":
        return value.type in allowed.type
    if kind == "list":
        return all(t in allowed.type for t in value.list.type) and all(s in allowed.s for s in value.list.s) \
            and all(i in allowed.i for i in value.list.i)
    if kind == "s":
        return value.s in allowed.s
    if kind == "i":
        return value.i in allowed.i
    return True


def kernel_for(node: node_def_pb2.NodeDef, kind: str) -> kernel_def_pb2.KernelDef | None:
    """The kernel stock TensorFlow picks for `node` on a `kind` ("GPU", "CPU") device, or None.

    Like the runtime: kernels of that exact device type whose type constraints the node's attributes
    (with OpDef defaults) satisfy and whose label is the node's `_kernel`; else a DEFAULT kernel
    (queues, Assert, NoOp, ... are registered for every device that way); the highest priority wins.
    """
    found = registered_kernels(node.op)
    if not found:
        return None
    label = node.attr["_kernel"].s.decode() if "_kernel" in node.attr else ""
    # Only the constrained attributes decide: nodes that agree on them share one answer.
    values = [(name, attr_or_default(node, name)) for name in _constrained_attrs(node.op)]
    key = (node.op, kind, label) + tuple(_attr_key(v) for _, v in values)
    if key in _KERNEL_CHOICE:
        return _KERNEL_CHOICE[key]
    return _kernel_for_key(key, {n: v for n, v in values if v is not None})


def _attr_key(value: attr_value_pb2.AttrValue | None):
    """A cheap hashable stand-in for an attribute value (constraints are nearly always on types)."""
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "type":
        return value.type
    if kind == "list" and not value.list.s and not value.list.i:
        return tuple(value.list.type)
    return value.SerializeToString(deterministic=True)


def attr_or_default(node: node_def_pb2.NodeDef, name: str) -> attr_value_pb2.AttrValue | None:
    """The value of attribute `name` of `node`, else its OpDef default; None when it has neither."""
    if name in node.attr:
        return node.attr[name]
    return _attr_default(node.op, name)


@functools.lru_cache(maxsize=None)
def _attr_default(op_type: str, name: str) -> attr_value_pb2.AttrValue | None:
    od = op_def(op_type)
    for a in od.attr if od is not None else ():
        if a.name == name and a.HasField("default_value"):
            return a.default_value
    return None


@functools.lru_cache(maxsize=None)
def _constrained_attrs(op_type: str) -> tuple[str, ...]:
    return tuple(sorted({c.name for k in registered_kernels(op_type) for c in k.constraint}))


_KERNEL_CHOICE: dict[tuple, kernel_def_pb2.KernelDef | None] = {}


def _kernel_for_key(key: tuple, attrs: Mapping[str, attr_value_pb2.AttrValue]) -> kernel_def_pb2.KernelDef | None:
    op_type, kind, label = key[:3]
    choice = None
    for device_kind in (kind, DEFAULT):
        matching = [k for k in registered_kernels(op_type) if k.device_type == device_kind and k.label == label
                    and all(_constraint_holds(c, attrs) for c in k.constraint)]
        if matching:
            choice = max(matching, key=lambda k: k.priority)
            break
    _KERNEL_CHOICE[key] = choice
    return choice


def has_kernel(node: node_def_pb2.NodeDef, kind: str) -> bool | None:
    """Whether `node` can run on a `kind` device; None when TensorFlow does not know its op type."""
    if op_def(node.op) is None:
        return None
    return kernel_for(node, kind) is not None


def _arg_layout(node: node_def_pb2.NodeDef, args) -> list[tuple[str, int]] | None:
    """(argument name, dtype) for every tensor of `args` (OpDef input_arg or output_arg), in order."""
    attrs = _attrs_with_defaults(node)
    layout: list[tuple[str, int]] = []
    for arg in args:
        if arg.type_list_attr:
            if arg.type_list_attr not in attrs:
                return None
            types = list(attrs[arg.type_list_attr].list.type)
        else:
            dtype = arg.type or (attrs[arg.type_attr].type if arg.type_attr in attrs else None)
            if dtype is None:
                return None
            count = attrs[arg.number_attr].i if arg.number_attr else 1
            if arg.number_attr and arg.number_attr not in attrs:
                return None
            types = [dtype] * count
        if arg.is_ref:
            types = [t + 100 if t < 100 else t for t in types]
        layout.extend((arg.name, t) for t in types)
    return layout


def _memory(node: node_def_pb2.NodeDef, index: int, kind: str, outputs: bool) -> str | None:
    od = op_def(node.op)
    if od is None:
        return None
    layout = _arg_layout(node, od.output_arg if outputs else od.input_arg)
    if layout is None or index >= len(layout):
        return None
    arg_name, dtype = layout[index]
    if dtype in ALWAYS_ON_HOST:
        return HOST
    forced = "_output_hostmem" if outputs else "_input_hostmem"
    if forced in node.attr and index in node.attr[forced].list.i:
        return HOST
    if kind == CPU:
        return HOST
    kernel = kernel_for(node, kind)
    if kernel is None:
        return None
    return HOST if arg_name in kernel.host_memory_arg else DEVICE


def input_memory(node: node_def_pb2.NodeDef, index: int, kind: str = GPU) -> str | None:
    """Where `node` reads its data input `index` when it runs on a `kind` device: "host" or "device".

    Follows MemoryTypesForNode of stock TensorFlow: the kernel's HostMemory arguments, always-on-host
    dtypes (string, resource) and a `_input_hostmem` attribute mean host memory. With a kernel, int32
    is NOT implied host memory: GPU kernels declare their int32 shape arguments HostMemory themselves.
    None when the node has no kernel for `kind` (it cannot run there).
    """
    return _memory(node, index, kind, outputs=False)


def output_memory(node: node_def_pb2.NodeDef, index: int, kind: str = GPU) -> str | None:
    """Where `node` leaves its output `index` on a `kind` device (see input_memory)."""
    return _memory(node, index, kind, outputs=True)


__all__ = [
    "ALWAYS_ON_HOST", "DEFAULT", "DEVICE", "HOST", "attr_or_default", "has_kernel", "input_memory", "kernel_for",
    "output_memory", "registered_kernels",
]
