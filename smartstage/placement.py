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


def stage_task(*candidates: Iterable[str]) -> DeviceSpec:
    """The task of a stage, from groups of device strings in order of authority (say: its own ops, then
    its readers): the first group naming a task decides. Within it the tasks named are merged when they
    agree ("/job:worker/task:1" and "/job:worker/replica:0/task:1" give the latter), else the most common
    wins (ties: the smallest); so the answer never depends on the order of the strings."""
    for devices in candidates:
        tasks = [task_spec(d) for d in devices]
        tasks = [t for t in tasks if has_task(t)]
        if not tasks:
            continue
        merged = tasks[0]
        for t in tasks[1:]:
            merged = merge_compatible(merged, t)
            if merged is None:
                break
        if merged is not None:
            return merged
        best = most_common(t.to_string() for t in tasks)
        return parse_device(best)
    return DeviceSpec()


def merge_compatible(a: DeviceSpec, b: DeviceSpec) -> DeviceSpec | None:
    """The union of two device specs' fields, or None when a field is set differently in each."""
    fields = ("job", "replica", "task", "device_type", "device_index")
    for f in fields:
        va, vb = getattr(a, f), getattr(b, f)
        if va is not None and vb is not None and (va.upper() if isinstance(va, str) and f == "device_type" else va) \
                != (vb.upper() if isinstance(vb, str) and f == "device_type" else vb):
            return None
    return a.make_merged_spec(b)


@functools.lru_cache(maxsize=4096)
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


@functools.lru_cache(maxsize=4096)
def same_device(a: str, b: str) -> bool:
    """Whether two device strings name the same device ("/gpu:0" == "/device:GPU:0")."""
    return parse_device(a) == parse_device(b)


def covers(wanted: str, device: str) -> bool:
    """Whether `device` (maybe partial) is consistent with the full `wanted` device: no field contradicts it."""
    if not device:
        return False
    return parse_device(wanted).make_merged_spec(parse_device(device)) == parse_device(wanted)


def most_common(devices: Iterable[str]) -> str | None:
    """The most frequent device string (the smallest string wins a tie, whatever the order), or None."""
    counts = Counter(devices)
    if not counts:
        return None
    return min(counts, key=lambda d: (-counts[d], d))


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
    label = node.attr["_kernel"].s.decode() if "_kernel" in node.attr else ""
    # Only the constrained attributes decide: nodes that agree on them share one answer.
    values = [(name, _attr_or_default(node, name)) for name in _constrained_attrs(node.op)]
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


def _attr_or_default(node: node_def_pb2.NodeDef, name: str) -> attr_value_pb2.AttrValue | None:
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


# -- colocation ----------------------------------------------------------------------------------
class ColocationGroups:
    """The groups of nodes stock TensorFlow's placer puts on one device.

    Two nodes are in one group when one names the other in its `_class` attribute (`loc:@name`, what
    tf.colocate_with writes) or when one reads a resource or ref output of the other (a queue or table
    handle and its users, a variable and its reads; the placer colocates those edges), transitively.
    Groups are found on demand, so asking about the prefetch side costs what the prefetch side is worth.
    """

    def __init__(self, view: GraphView):
        self.view = view
        self._class_links: dict[str, set[str]] = {}
        for node in view.graph_def.node:
            if _COLOCATION_ATTR in node.attr:
                for loc in node.attr[_COLOCATION_ATTR].list.s:
                    if loc.startswith(_COLOCATION_PREFIX):
                        other = loc[len(_COLOCATION_PREFIX):].decode()
                        if other in view and other != node.name:
                            self._class_links.setdefault(node.name, set()).add(other)
                            self._class_links.setdefault(other, set()).add(node.name)
        self._handles: dict[str, frozenset[int]] = {}
        self._groups: dict[str, tuple[str, ...]] = {}

    def _handle_ports_of(self, name: str) -> frozenset[int]:
        if name not in self._handles:
            self._handles[name] = _handle_ports(self.view, name) if name in self.view else frozenset()
        return self._handles[name]

    def _neighbours(self, name: str):
        view = self.view
        yield from self._class_links.get(name, ())
        exempt = view.op(name) in _COLOCATION_EXEMPT_OPS
        if not exempt:
            for t in view.data_inputs(name):
                if t.port in self._handle_ports_of(t.node):
                    yield t.node
        handles = self._handle_ports_of(name)
        if handles:
            for f in view.fanouts(name):
                if f.port in handles and view.op(f.consumer) not in _COLOCATION_EXEMPT_OPS:
                    yield f.consumer

    def group(self, name: str) -> tuple[str, ...]:
        """Every node colocated with `name`, `name` included, in a stable order."""
        found = self._groups.get(name)
        if found is not None:
            return found
        seen = {name}
        todo = [name]
        while todo:
            for other in self._neighbours(todo.pop()):
                if other not in seen and other in self.view:
                    seen.add(other)
                    todo.append(other)
        group = tuple(sorted(seen))
        for member in group:
            self._groups[member] = group
        return group


def _handle_ports(view: GraphView, name: str) -> frozenset[int]:
    """The outputs of `name` that are resource handles or refs (legacy variables, v1 queues)."""
    node = view.node(name)
    if not _may_output_handle(node):
        return frozenset()
    types = view.output_dtypes(name) or []
    return frozenset(i for i, d in enumerate(types) if d in _HANDLE_TYPES or d > 100)


_HANDLE_TYPES = frozenset({types_pb2.DT_RESOURCE, types_pb2.DT_RESOURCE_REF})


def _may_output_handle(node: node_def_pb2.NodeDef) -> bool:
    """A quick no for the common case: no output of the op can be a resource or a ref, given its type attrs."""
    od = op_def(node.op)
    if od is None:
        return True
    for arg in od.output_arg:
        if arg.is_ref or arg.type in _HANDLE_TYPES:
            return True
        if arg.type_attr:
            value = _attr_or_default(node, arg.type_attr)
            if value is None or value.type in _HANDLE_TYPES:
                return True
        if arg.type_list_attr:
            value = _attr_or_default(node, arg.type_list_attr)
            if value is None or any(t in _HANDLE_TYPES for t in value.list.type):
                return True
    return False


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
    "cpu_device_for", "covers", "merge_compatible", "device_type", "has_kernel", "has_task", "input_memory", "is_gpu",
    "kernel_for", "most_common", "output_memory", "parse_device", "prefetch_sides", "registered_kernels",
    "same_device", "stage_task", "task_spec",
]
