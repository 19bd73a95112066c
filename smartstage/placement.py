"""Device placement facts the GPU passes share: device strings, kernels and memory types, colocation, sides.

    cpu_device_for("/job:worker/replica:0/task:1/device:GPU:0", stage_task)  # "/job:worker/replica:0/task:1/device:CPU:0"
    kernel_for(node, "GPU")              # the KernelDef stock TensorFlow would run it with on a GPU, or None
    input_memory(node, 1, "GPU")         # "host" (e.g. Reshape's shape) or "device"
    ColocationGroups(view).group("q")    # {"q", "put", "take", ...}: nodes the placer keeps on one device
    prefetch_sides(view, stages)         # per stage, the nodes its put needs; which of them the main side uses too

Everything here reads the GraphDef and TensorFlow's registries; nothing edits a graph. The kernel
registry of the installed TensorFlow is the CUDA build's (GPU kernels are registered even on a machine
without a GPU), so "has a GPU kernel" and "reads this input in host memory" are answered the way the
placer and the executor of a GPU machine would answer them, for the node's own attribute values.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from tensorflow.core.framework import attr_value_pb2, kernel_def_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import device_spec

from smartstage.graph import GraphView, op_def
from smartstage.passes.find_stages import StageBoundary

DeviceSpec = device_spec.DeviceSpecV2

CPU = "CPU"
GPU = "GPU"
DEFAULT = "DEFAULT"
HOST = "host"
DEVICE = "device"

# DataTypeAlwaysOnHost in stock TensorFlow: these never live in device memory, whatever the kernel says.
ALWAYS_ON_HOST = frozenset({types_pb2.DT_STRING, types_pb2.DT_STRING_REF, types_pb2.DT_RESOURCE,
                            types_pb2.DT_RESOURCE_REF})
# Ops whose resource inputs the placer does not colocate with the resource (functions run anywhere).
_COLOCATION_EXEMPT_OPS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                                    "PartitionedCall", "StatefulPartitionedCall"})
_COLOCATION_ATTR = "_class"
_COLOCATION_PREFIX = b"loc:@"


# -- device strings ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def parse_device(device: str) -> DeviceSpec:
    """The DeviceSpec of a device string ("" gives an empty spec); "/gpu:0" and "/device:GPU:0" agree."""
    return DeviceSpec.from_string(device or "")


def device_type(device: str) -> str | None:
    """"GPU", "CPU", ... of a device string, upper-cased; None when the string names no device type."""
    kind = parse_device(device).device_type
    return kind.upper() if kind else None


def is_gpu(device: str) -> bool:
    return device_type(device) == GPU


def task_spec(device: str) -> DeviceSpec:
    """Only the job, replica and task of a device string."""
    spec = parse_device(device)
    return DeviceSpec(job=spec.job, replica=spec.replica, task=spec.task)


def has_task(spec: DeviceSpec) -> bool:
    return spec.job is not None or spec.replica is not None or spec.task is not None


def stage_task(devices: Iterable[str]) -> DeviceSpec:
    """The task of a stage: that of the first of `devices` (put, take, buffer) naming one; empty if none does."""
    for device in devices:
        spec = task_spec(device)
        if has_task(spec):
            return spec
    return DeviceSpec()


def cpu_device_for(device: str, default_task: DeviceSpec) -> str:
    """The CPU of the task `device` is on: job, replica and task kept, the device made CPU.

    A device that names no job, replica or task gets `default_task` (the stage's task); a device
    already on a CPU keeps its CPU index.

    >>> cpu_device_for("/job:worker/replica:0/task:1/device:GPU:0", DeviceSpec())
    '/job:worker/replica:0/task:1/device:CPU:0'
    >>> cpu_device_for("", DeviceSpec())
    '/device:CPU:0'
    """
    spec = parse_device(device)
    task = DeviceSpec(job=spec.job, replica=spec.replica, task=spec.task) if has_task(spec) else default_task
    index = spec.device_index if device_type(device) == CPU and spec.device_index is not None else 0
    return task.replace(device_type=CPU, device_index=index).to_string()


def same_device(a: str, b: str) -> bool:
    """Whether two device strings name the same device ("/gpu:0" == "/device:GPU:0")."""
    return parse_device(a) == parse_device(b)


def covers(wanted: str, device: str) -> bool:
    """Whether `device` (maybe partial) is consistent with the full `wanted` device: no field contradicts it."""
    if not device:
        return False
    return parse_device(wanted).make_merged_spec(parse_device(device)) == parse_device(wanted)


def most_common(devices: Iterable[str]) -> str | None:
    """The most frequent device string (first seen wins a tie), or None."""
    counts = Counter(devices)
    if not counts:
        return None
    best = max(counts.values())
    return next(d for d in counts if counts[d] == best)


# -- kernels and memory types ----------------------------------------------------------------------
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
    attrs = _attrs_with_defaults(node)
    label = attrs["_kernel"].s.decode() if "_kernel" in attrs else ""
    for device_kind in (kind, DEFAULT):
        matching = [k for k in found if k.device_type == device_kind and k.label == label
                    and all(_constraint_holds(c, attrs) for c in k.constraint)]
        if matching:
            return max(matching, key=lambda k: k.priority)
    return None


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


# -- colocation ----------------------------------------------------------------------------------
class ColocationGroups:
    """The groups of nodes stock TensorFlow's placer puts on one device.

    Two nodes are in one group when one names the other in its `_class` attribute (`loc:@name`, what
    tf.colocate_with writes) or when one reads a resource or ref output of the other (a queue or table
    handle and its users, a variable and its reads; the placer colocates those edges), transitively.
    """

    def __init__(self, view: GraphView):
        self._parent: dict[str, str] = {}
        for name in view.names():
            node = view.node(name)
            if _COLOCATION_ATTR in node.attr:
                for loc in node.attr[_COLOCATION_ATTR].list.s:
                    if loc.startswith(_COLOCATION_PREFIX):
                        other = loc[len(_COLOCATION_PREFIX):].decode()
                        if other in view:
                            self._union(name, other)
            if node.op in _COLOCATION_EXEMPT_OPS:
                continue
            for t in view.data_inputs(name):
                if t.node in view and _is_handle(view, t.node, t.port):
                    self._union(name, t.node)
        self._members: dict[str, list[str]] = {}
        for name in self._parent:
            self._members.setdefault(self._find(name), []).append(name)

    def _find(self, name: str) -> str:
        parent = self._parent.setdefault(name, name)
        while parent != name:
            grand = self._parent.setdefault(parent, parent)
            self._parent[name] = grand
            name, parent = parent, grand
        return name

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    def group(self, name: str) -> tuple[str, ...]:
        """Every node colocated with `name`, `name` included, in a stable order."""
        if name not in self._parent:
            return (name,)
        return tuple(sorted(self._members[self._find(name)]))


def _is_handle(view: GraphView, name: str, port: int) -> bool:
    """Whether output `port` of `name` is a resource handle or a ref (legacy variable, v1 queue)."""
    types = view.output_dtypes(name)
    dtype = types[port] if types is not None and port < len(types) else None
    return dtype is not None and (dtype in (types_pb2.DT_RESOURCE, types_pb2.DT_RESOURCE_REF) or dtype > 100)


# -- sides -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefetchSides:
    """The prefetch side of every stage, read from the graph as it is now (after the CPU expansion).

    side[stage]: the nodes the stage's put needs, not entering any stage's own ops (so a chained
    stage's prefetch side ends at the earlier stage's take). shared: the nodes of some prefetch side
    that the main side evaluates too (a constant both sides read, and what it is computed from);
    main_users[node]: for a shared node read directly by the main side, those main-side readers.
    """

    stage_ops: frozenset[str]
    side: Mapping[str, frozenset[str]]
    owners: Mapping[str, tuple[str, ...]]
    shared: frozenset[str]
    main_users: Mapping[str, tuple[str, ...]]

    def prefetch_only(self, stage: str) -> list[str]:
        return sorted(n for n in self.side.get(stage, ()) if n not in self.shared)


def prefetch_sides(view: GraphView, stages: Iterable[StageBoundary]) -> PrefetchSides:
    stages = list(stages)
    stage_ops = frozenset(n for s in stages for n in s.ops)
    puts = {s.put for s in stages}
    side: dict[str, frozenset[str]] = {}
    owners: dict[str, list[str]] = {}
    for stage in stages:
        roots = [t.node for t in view.inputs(stage.put) if t.node in view and t.node not in stage_ops]
        nodes = frozenset(view.ancestors(roots, stop=set(stage_ops)))
        side[stage.name] = nodes
        for n in nodes:
            owners.setdefault(n, []).append(stage.name)
    on_prefetch = set(owners)
    main_users: dict[str, tuple[str, ...]] = {}
    for name in sorted(on_prefetch):
        users = [c for c in view.consumers(name) if c not in on_prefetch and c not in puts]
        if users:
            main_users[name] = tuple(users)
    shared = frozenset(view.ancestors(main_users, stop=set(stage_ops)) & on_prefetch)
    return PrefetchSides(stage_ops, side, {n: tuple(o) for n, o in owners.items()}, shared, main_users)


__all__ = [
    "ALWAYS_ON_HOST", "CPU", "DEVICE", "DeviceSpec", "ColocationGroups", "GPU", "HOST", "PrefetchSides",
    "cpu_device_for", "covers", "device_type", "has_kernel", "has_task", "input_memory", "is_gpu",
    "kernel_for", "most_common", "output_memory", "parse_device", "prefetch_sides", "registered_kernels",
    "same_device", "stage_task", "task_spec",
]
