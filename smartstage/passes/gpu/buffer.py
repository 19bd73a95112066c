"""The buffer side of gpu_placement: which GPU reads a stage, and how the buffer holds each boundary tensor.

    main_gpu_of(view, groups, sides, stage, task, None)       # "/device:GPU:0": the take's readers run there
    component_memory(view, edits, stage, "/device:GPU:0")      # [("device", why), ("host", why), ...] per take output
    describe_boundary(view, edits, stage, memory, True, gpu)  # BoundaryCopy per tensor: where its H2D copy happens

A boundary tensor is held in device memory only when every main-side reader reads it in GPU memory;
strings, resources and variants, and tensors read on a CPU, without a GPU kernel or through a HostMemory
argument stay in host memory (set_hostmem marks them `_input_hostmem` / `_output_hostmem`). Everything
here reads the graph and the edits planned so far; only set_hostmem adds edits, and only to `edits`.
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2, types_pb2

from smartstage.graph.names import CONTROL_PORT
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import dtype_name
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.op_types import STAGING_OPS
from smartstage.passes.gpu.edits import PlacementEdits
from smartstage.passes.gpu.report import BoundaryCopy
from smartstage.passes.gpu.colocation import ColocationGroups
from smartstage.passes.gpu.devices import GPU, DeviceSpec, covers, is_gpu, most_common, parse_device
from smartstage.passes.gpu.kernels import ALWAYS_ON_HOST, DEVICE, HOST, has_kernel, input_memory
from smartstage.passes.gpu.prefetch_sides import PrefetchSides

_HOST_ONLY_IN_BUFFER = ALWAYS_ON_HOST | {types_pb2.DT_VARIANT}  # variants: no device copy function is assumed
_OUTPUT_HOSTMEM_OPS = {"StagePeek"}  # stage ops that hand out components besides the take


def main_gpu_of(view: GraphView, groups: ColocationGroups, sides: PrefetchSides, stage: StageBoundary,
                task: DeviceSpec, main_device: str | None) -> str | None:
    """The GPU the main side reads `stage` on: one the buffer's ops name (take, put, buffer first), else the
    most common GPU of the take's main-side readers, else `main_device`; None if none is known."""

    def full(device: str) -> str:
        return task.make_merged_spec(parse_device(device)).to_string()

    buffer_ops = set(groups.group(stage.buffer or stage.put)) | set(stage.ops)
    first = [n for n in (stage.take, stage.put, stage.buffer) if n]
    for name in first + sorted(buffer_ops - set(first)):
        if is_gpu(view.node(name).device):
            return full(view.node(name).device)
    readers = [view.node(f.consumer).device for f in view.fanouts(stage.take)
               if f.port != CONTROL_PORT and f.consumer not in sides.owners]
    common = most_common(parse_device(d).to_string() for d in readers if is_gpu(d))
    if common:
        return full(common)
    if main_device:
        return full(main_device)
    return None


def component_memory(view: GraphView, edits: PlacementEdits, stage: StageBoundary,
                     main_gpu: str) -> list[tuple[str, str]]:
    """(memory, reason) for each component of the take: "device" only if every reader wants it on main_gpu."""
    dtypes = view.output_dtypes(stage.take) or []
    readers: dict[int, list[tuple[str, int]]] = {}
    for f in sorted(view.fanouts(stage.take)):  # sorted: the verdict and its reason never depend on order
        if f.port != CONTROL_PORT:
            readers.setdefault(f.port, []).append((f.consumer, f.index))
    result = []
    for j, dtype in enumerate(dtypes):
        result.append(_memory_of(view, edits, dtype, readers.get(j, []), main_gpu))
    return result


def _memory_of(view: GraphView, edits: PlacementEdits, dtype: int, readers: list[tuple[str, int]],
               main_gpu: str) -> tuple[str, str]:
    if dtype in _HOST_ONLY_IN_BUFFER:
        return HOST, f"{dtype_name(dtype)} tensors stay in host memory"
    if not readers:
        return HOST, "no main-side reader"
    for consumer, index in readers:
        device = edits.device_of(consumer) or main_gpu
        if not covers(main_gpu, device) or (parse_device(device).device_type or GPU).upper() != GPU:
            return HOST, f"{consumer!r} reads it on {device}"
        where = input_memory(view.node(consumer), index, GPU)
        if where is None:
            return HOST, f"{consumer!r} ({view.op(consumer)}) has no GPU kernel: it runs on the CPU"
        if where == HOST:
            return HOST, f"{consumer!r} ({view.op(consumer)}) reads it in host memory on the GPU"
    return DEVICE, "every main-side reader reads it in GPU memory"


def buffer_problem(view: GraphView, groups: ColocationGroups, stage: StageBoundary) -> str:
    """Why the buffer of `stage` and everything colocated with it cannot move to a GPU ("" when it can)."""
    buffer_node = stage.buffer or stage.put
    members = sorted(set(groups.group(buffer_node)) | set(stage.ops))
    for m in members:
        node = view.node(m)
        if m not in stage.ops and not _is_buffer_op(node.op):
            return f"{m!r} ({node.op}) is colocated with the buffer but is not part of the stage"
        known = has_kernel(node, GPU)
        if known is None:
            return f"{m!r} has op type {node.op!r}, unknown to this TensorFlow"
        if not known:
            return f"{m!r} ({node.op}) has no GPU kernel (use FIFOQueueV2, as smartstage.staged does)"
    return ""


def set_hostmem(view: GraphView, edits: PlacementEdits, stage: StageBoundary,
                memory: list[tuple[str, str]]) -> None:
    """Adds to `edits` the `_input_hostmem` of the put and `_output_hostmem` of the take (and StagePeek) that
    keep the host-memory components of `memory` on the host (removing them when there are none)."""
    host = [j for j, (m, _) in enumerate(memory) if m == HOST]
    offset = 1 if stage.kind == FIFO else 0

    def int_list(values):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(i=values)) if values else None

    edits.set_attr(stage.put, "_input_hostmem", int_list([offset + j for j in host]))
    edits.set_attr(stage.take, "_output_hostmem", int_list(host))
    for name in stage.related:
        if view.op(name) in _OUTPUT_HOSTMEM_OPS:
            edits.set_attr(name, "_output_hostmem", int_list(host))


def describe_boundary(view: GraphView, edits: PlacementEdits, stage: StageBoundary, memory: list[tuple[str, str]],
                      on_gpu: bool, main_gpu: str) -> list[BoundaryCopy]:
    """Per boundary tensor: how the buffer holds it and where its copy to the GPU happens now."""
    carried = stage.put_data_inputs(view)
    dtypes = view.output_dtypes(stage.take) or []
    readers: dict[int, list] = {}
    for f in sorted(view.fanouts(stage.take)):
        readers.setdefault(f.port, []).append(f)
    result = []
    for j, (where, reason) in enumerate(memory):
        tensor = str(carried[j]) if j < len(carried) else "?"
        producer = carried[j].node if j < len(carried) else ""
        if where == DEVICE and on_gpu:
            source = edits.device_of(producer) if producer else ""
            copy = ("none: produced on the GPU" if is_gpu(source) else
                    f"at the put {stage.put!r}, in the prefetch run ({source or 'host'} -> {main_gpu})")
        else:
            where = HOST
            gpu_readers = [f.consumer for f in readers.get(j, ())
                           if input_memory(view.node(f.consumer), f.index, GPU) == DEVICE
                           and is_gpu(edits.device_of(f.consumer) or main_gpu)]
            copy = (f"on the main side, when {', '.join(gpu_readers[:3])} read(s) it" if gpu_readers
                    else "none: it is never copied to a GPU")
        result.append(BoundaryCopy(tensor, f"{stage.take}:{j}", dtype_name(dtypes[j]) if j < len(dtypes) else "?",
                                   where, copy, reason))
    return result


def _is_buffer_op(op_type: str) -> bool:
    """Ops that only operate a buffer (a queue or staging area): they follow the buffer to its device."""
    return op_type.startswith("Queue") or op_type in STAGING_OPS


__all__ = ["buffer_problem", "component_memory", "describe_boundary", "main_gpu_of", "set_hostmem"]
