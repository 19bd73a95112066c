"""gpu_placement: the prefetch side runs on its task's CPU; the buffer holds GPU tensors (do_smart_stage_gpu).

    before:  reader@GPU:0 -> hash@GPU:0 -> put@CPU ~~ take@CPU -> lookup(w)@GPU:0     (H2D copy in the step)
    after:   reader@CPU:0 -> hash@CPU:0 -> put@GPU:0 ~~ take@GPU:0 -> lookup(w)@GPU:0  (H2D copy at the put)

Runs after expand_stage. Per stage:

1. Every node of the prefetch side (what the put needs, not crossing any buffer) goes to the CPU of the
   task its device names (/job:worker/replica:0/task:1/device:GPU:0 -> .../task:1/device:CPU:0; a node
   naming no task gets the stage's task, or plain /device:CPU:0 on one machine). Never another task's
   CPU. A colocation group (`_class` loc:@, resource and ref edges) moves as a whole or not at all; its
   main-side members may come along only when the group cannot run on a GPU anyway (one member has no
   GPU kernel, so the placer puts all of it on a CPU, whatever the device strings say).
2. A node the main side evaluates too (a constant both sides read) keeps its device: the main side
   needs it where it is (unless its group is CPU-bound as above: then it runs on that CPU already). The prefetch side gets its own CPU copy, `<stage>/prefetch_copy/<name>`, when
   the node is stateless, pure (no fed, stateful, ref or resource input) and small; otherwise it is left
   and the report says why. Copies are cheap, and without them every prefetch run would fetch the value
   from the GPU (a device-to-host copy on the GPU's streams, in the middle of the training step).
3. The buffer and every op of the stage (put, take, close, cancel, size) go to the main side's GPU,
   when at least one boundary tensor is read there in device memory. Stock TensorFlow registers
   FIFOQueueV2, QueueEnqueueV2, QueueDequeueV2, QueueCloseV2 and QueueSizeV2 for every device
   (DEVICE_DEFAULT, handle in host memory; it is what tf.raw_ops GPUCompatibleFIFOQueue builds on), so
   the put's inputs are copied to the GPU by the prefetch run and the take hands the main side device
   tensors. The same queue keeps every guarantee of the CPU stage: close drains then raises
   OutOfRange, cancel wakes blocked puts and takes, no second buffer, no new StageDef.
   Boundary tensors the main side does not read in GPU memory stay in host memory inside that queue:
   strings and resources always (TensorFlow keeps them on the host), and any tensor with a reader on the
   CPU, without a GPU kernel, or reading it through a HostMemory argument (the int32 shape inputs of
   Reshape, Fill, Slice, ...): the put gets `_input_hostmem`, the take `_output_hostmem` (attributes stock
   TensorFlow's MemoryTypesForNode honours), so no int32 shape ever makes a round trip to the GPU.

The report (summary, details, ctx.gpu_placement) lists per stage every device change
(from -> to), every copy made, every node left and why, and for each boundary tensor where its copy to
the GPU now happens.

The report dataclasses live in passes/gpu/report.py, the collected edits (an edit log, smartstage.graph.edits,
returned in PassResult.edits) in passes/gpu/edits.py, and the buffer's GPU and boundary memory (step 3's
analysis) in passes/gpu/buffer.py.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2, node_def_pb2

from smartstage.graph.edits import apply_to_graph_def, dedupe_controls
from smartstage.graph.view import GraphView
from smartstage.graph.names import input_string, parse_tensor_name
from smartstage.graph.op_types import UNFEEDABLE_DTYPES, is_ref_dtype, is_stateful_op, op_def
from smartstage.graph.stages import StageBoundary
from smartstage.passes.gpu.buffer import (
    buffer_problem,
    component_memory,
    describe_boundary,
    main_gpu_of,
    set_hostmem,
)
from smartstage.passes.gpu.edits import PlacementEdits
from smartstage.passes.gpu.report import BoundaryCopy, DeviceChange, KeptNode, StagePlacement
from smartstage.graph.op_types import FEED_OPS, FUNCTIONAL_OPS
from smartstage.passes.manager import PassContext, PassResult
from smartstage.passes.gpu.colocation import ColocationGroups
from smartstage.passes.gpu.devices import (
    CPU,
    GPU,
    DeviceSpec,
    cpu_device_for,
    has_task,
    is_gpu,
    merge_compatible,
    parse_device,
    same_device,
    stage_task,
    task_spec,
)
from smartstage.passes.gpu.kernels import DEVICE, has_kernel
from smartstage.passes.gpu.prefetch_sides import PrefetchSides, prefetch_sides

COPY_SCOPE = "prefetch_copy"
MAX_COPY_BYTES = 1 << 20  # total NodeDef bytes the pass may duplicate (constants are the bulk)


class GpuPlacement:
    """Pass: places each stage's prefetch side on its task's CPU and its buffer on the main side's GPU."""

    name = "gpu_placement"
    requires = ("stages",)
    provides = ("gpu_placement",)

    def __init__(self, main_device: str | None = None, max_copy_bytes: int = MAX_COPY_BYTES):
        # main_device: the GPU the main side runs on, for graphs that leave the main side unplaced.
        self.main_device = main_device
        self.max_copy_bytes = max_copy_bytes

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        stages = list(ctx.stages)
        if not stages:
            ctx.gpu_placement = {}
            return PassResult(graph_def, changed=False, summary=("no stage: nothing to place",), details=())
        planner = _Planner(view, stages, self.main_device, self.max_copy_bytes)
        placements = planner.plan()
        ctx.gpu_placement = {p.stage: p for p in placements}
        summary = [line for p in placements for line in p.summary_lines()]
        if planner.edits.empty:
            summary.append("nothing to place: every prefetch-side node is on its CPU already and no buffer needs "
                           "to move")
            return PassResult(graph_def, changed=False, summary=tuple(summary), details=tuple(placements))
        edits = planner.edits.edits
        return PassResult(apply_to_graph_def(graph_def, edits, view), changed=True, summary=tuple(summary),
                          details=tuple(placements), edits=edits)


class _Planner:
    """Decides every edit of one run of the pass (analysis; apply_to_graph_def is the only writer)."""

    def __init__(self, view: GraphView, stages: list[StageBoundary], main_device: str | None, max_copy_bytes: int):
        self.view = view
        self.stages = stages
        self.main_device = main_device
        self.copy_budget = self.max_copy_bytes = max_copy_bytes
        self.sides: PrefetchSides = prefetch_sides(view, stages)
        self.groups = ColocationGroups(view)
        self.edits = PlacementEdits(view)
        # Where each stage's main side reads it (its GPU), and the task of the stage: that GPU's task, else
        # the one the stage's ops name, else the one its readers name. Both come from the graph as it was,
        # so a second run finds the same answers (the buffer has moved to that GPU by then).
        self.main_gpu: dict[str, str | None] = {}
        self.task: dict[str, DeviceSpec] = {}
        for s in stages:
            base = stage_task([view.node(n).device for n in s.ops],
                              [view.node(f.consumer).device for f in view.fanouts(s.take)])
            self.main_gpu[s.name] = main_gpu_of(view, self.groups, self.sides, s, base, main_device)
            gpu_task = task_spec(self.main_gpu[s.name] or "")
            self.task[s.name] = gpu_task if has_task(gpu_task) else base
        self.changes: dict[str, list[DeviceChange]] = {s.name: [] for s in stages}
        self.kept: dict[str, list[KeptNode]] = {s.name: [] for s in stages}
        self.copies: dict[str, list[tuple[str, str]]] = {s.name: [] for s in stages}
        self._copy_of: dict[tuple[str, str], str | None] = {}
        self._cpu_bound_groups: dict[tuple[str, ...], bool] = {}

    def plan(self) -> list[StagePlacement]:
        self._place_prefetch_sides()
        for stage in self.stages:
            self._copy_shared_inputs(stage)
        return [self._place_buffer(stage) for stage in self.stages]

    # -- 1. prefetch side -> its task's CPU --------------------------------------------------------
    def _place_prefetch_sides(self) -> None:
        view, sides = self.view, self.sides
        wanted: dict[str, str] = {}
        first_owner: dict[str, str] = {}
        for stage in self.stages:
            for name in sorted(sides.side[stage.name]):
                if name in first_owner:
                    continue
                if name in sides.shared and not self._cpu_bound(name):
                    continue  # the main side needs it where it is; step 2 gives the prefetch side a copy
                first_owner[name] = stage.name
                device = view.node(name).device
                targets = {cpu_device_for(device, self.task[o]) for o in sides.owners[name]}
                if len(targets) > 1:
                    self._keep(stage.name, name, "it is on the prefetch side of stages on different tasks "
                                                 f"({', '.join(sides.owners[name])})")
                    continue
                wanted[name] = targets.pop()
        decided: set[str] = set()
        for name in sorted(wanted):
            if name in decided:
                continue
            members = self.groups.group(name)
            decided.update(m for m in members if m in wanted)
            # Members may name the same CPU more or less fully ("/job:w/task:1" and "/job:w/replica:0/task:1"):
            # the group takes the fullest name they agree on.
            target: str | None = wanted[name]
            for m in members:
                if m in wanted and target is not None:
                    merged = merge_compatible(parse_device(target), parse_device(wanted[m]))
                    target = merged.to_string() if merged is not None else None
            if target is None:
                problem = "its colocation group spans CPUs of different tasks: " + ", ".join(
                    sorted({wanted[m] for m in members if m in wanted}))
            else:
                for m in members:
                    if m in wanted:
                        wanted[m] = target
                problem = self._group_problem(name, members, target, wanted)
            stage = first_owner[name]
            if problem:
                for m in members:
                    if m in wanted:
                        self._keep(first_owner[m], m, problem)
                continue
            for m in members:
                before = self.edits.device_of(m)
                if self.edits.set_device(m, target):
                    why = ("prefetch side" if m in wanted and m not in self.sides.shared else
                           "used by both sides; its group runs on the CPU anyway" if m in wanted else
                           f"colocated with {name}; its group runs on the CPU anyway")
                    self.changes[first_owner.get(m, stage)].append(DeviceChange(m, before, target, why))

    def _group_problem(self, name: str, members: tuple[str, ...], target: str, wanted: dict[str, str]) -> str:
        """Why the colocation group of `name` cannot move to `target` as a whole ("" when it can)."""
        view, sides = self.view, self.sides
        for m in members:
            node = view.node(m)
            if m in wanted:
                if wanted[m] != target:
                    return f"its colocation group spans {target} and {wanted[m]} (via {m})"
            elif m in sides.stage_ops:
                return f"it is colocated with the stage op {m!r}"
            elif m in sides.shared:
                return f"it is colocated with {m!r}, which the main side uses too"
            elif m in sides.owners:
                return f"it is colocated with {m!r}, which stays where it is"
            elif not self._cpu_bound(name):
                # A group with a member that has no GPU kernel runs on a CPU whatever its device strings say
                # (the placer needs one device type for the whole group), so main-side members may come along.
                return (f"it is colocated with the main-side node {m!r} ({node.op}), which can run on a GPU; "
                        "a colocation group is never split")
            elif not same_device(cpu_device_for(node.device, parse_device(target)), target):
                return f"it is colocated with {m!r} on {node.device}, another task"
            known = has_kernel(node, CPU)
            if known is None:
                return f"{m!r} has op type {node.op!r}, unknown to this TensorFlow"
            if not known:
                return f"{m!r} ({node.op}) has no CPU kernel for its types"
        return ""

    def _cpu_bound(self, name: str) -> bool:
        """Whether the colocation group of `name` runs on a CPU whatever its devices say: a member has no GPU kernel."""
        group = self.groups.group(name)
        if group not in self._cpu_bound_groups:
            self._cpu_bound_groups[group] = any(has_kernel(self.view.node(m), GPU) is False for m in group)
        return self._cpu_bound_groups[group]

    def _keep(self, stage: str, name: str, reason: str) -> None:
        self.kept[stage].append(KeptNode(name, self.edits.device_of(name), reason))

    # -- 2. nodes the main side uses too: a CPU copy for the prefetch side ----------------------
    def _copy_shared_inputs(self, stage: StageBoundary) -> None:
        view, sides = self.view, self.sides
        consumers = [n for n in sides.prefetch_only(stage.name) if sides.owners[n][0] == stage.name] + [stage.put]
        for consumer in consumers:
            inputs = list(self.edits.inputs_of(consumer))
            rewired = False
            for i, s in enumerate(inputs):
                t = parse_tensor_name(s)
                if t.node not in sides.shared:
                    continue
                copy = self._copy(stage, t.node)
                if copy is not None:
                    inputs[i] = input_string(copy, t.port)
                    rewired = True
            if rewired:
                self.edits.set_inputs(consumer, dedupe_controls(inputs))

    def _copy(self, stage: StageBoundary, name: str) -> str | None:
        """The prefetch-side copy of shared node `name` for `stage` (made on first use), or None to read it."""
        key = (stage.name, name)
        if key in self._copy_of:
            return self._copy_of[key]
        self._copy_of[key] = None  # a cycle cannot happen in a DAG; this also memoises refusals
        node = self.view.node(name)
        device = self.edits.device_of(name)
        target = cpu_device_for(device, self.task[stage.name])
        if device and same_device(device, target):
            return None  # on this CPU already: the prefetch side reads it locally
        reason = self._not_copyable(node)
        if not reason and node.ByteSize() > self.copy_budget:
            reason = f"copying it would exceed the duplication budget ({self.max_copy_bytes} bytes of NodeDefs)"
        users = ", ".join(self.sides.main_users.get(name, ())[:3])
        if reason:
            self._keep(stage.name, name, f"the main side uses it too{f' ({users})' if users else ''}; not copied: "
                                         f"{reason}; the prefetch side reads it across devices")
            return None
        self.copy_budget -= node.ByteSize()
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        copy.name = self.edits.unique_name(f"{stage.name}/{COPY_SCOPE}/{name}")
        copy.device = target
        if "_class" in copy.attr:
            del copy.attr["_class"]  # the copy is stateless: no colocation ties it to the main side
        del copy.input[:]
        for s in node.input:
            t = parse_tensor_name(s)
            inner = self._copy(stage, t.node) if t.node in self.sides.shared else None
            copy.input.append(input_string(inner, t.port) if inner else s)
        copy.input[:] = dedupe_controls(copy.input)
        self.edits.add_node(copy)
        self._copy_of[key] = copy.name
        self.copies[stage.name].append((name, copy.name))
        return copy.name

    def _not_copyable(self, node: node_def_pb2.NodeDef) -> str:
        od = op_def(node.op)
        if od is None:
            return f"op type {node.op!r} is unknown to this TensorFlow"
        if node.op in FEED_OPS:
            return "it is fed"
        if node.op in FUNCTIONAL_OPS or is_stateful_op(node.op):
            return f"{node.op} is stateful or calls a function: a copy would run it twice"
        for t in self.view.inputs(node.name):
            if t.node in self.sides.stage_ops:
                return f"it reads the stage op {t.node!r}"
        types = self.view.output_dtypes(node.name) or []
        in_types = [self.view.dtype_of(t) for t in self.view.data_inputs(node.name)]
        if any(d is None or is_ref_dtype(d) or d in UNFEEDABLE_DTYPES for d in types + in_types):
            return "it handles refs, resources or variants"
        if not has_kernel(node, CPU):
            return f"{node.op} has no CPU kernel for its types"
        return ""
    # -- 3. the buffer -> the main side's GPU ------------------------------------------------------
    def _place_buffer(self, stage: StageBoundary) -> StagePlacement:
        view, edits = self.view, self.edits
        buffer_node = stage.buffer or stage.put
        before = view.node(buffer_node).device
        main_gpu = self.main_gpu[stage.name]
        notes: list[str] = []
        boundary: list[BoundaryCopy] = []
        if main_gpu is None:
            notes.append("the main side names no GPU (neither the take nor its readers have a GPU device): the buffer "
                         "stays where it is; place the model with tf.device('/device:GPU:0') or pass "
                         "GpuPlacement(main_device=...)")
        else:
            memory = component_memory(view, edits, stage, main_gpu)
            wants_gpu = any(m == DEVICE for m, _ in memory)
            problem = buffer_problem(view, self.groups, stage) if wants_gpu else ""
            if problem:
                notes.append(f"the buffer cannot move to {main_gpu} as a whole: {problem}; it stays on "
                             f"{before or 'no device'}")
            elif wants_gpu:
                members = sorted(set(self.groups.group(buffer_node)) | set(stage.ops))
                for m in members:
                    old = edits.device_of(m)
                    if edits.set_device(m, main_gpu):
                        self.changes[stage.name].append(DeviceChange(m, old, main_gpu, "stage"))
            else:
                notes.append("no boundary tensor is read in GPU memory on the main side: the buffer stays on "
                             f"{before or 'no device'}")
            # The placer keeps a buffer's ops together: one of them on a GPU puts the buffer there.
            buffer_ops = sorted(set(self.groups.group(buffer_node)) | set(stage.ops))
            on_gpu = any(is_gpu(edits.device_of(m)) for m in buffer_ops)
            if on_gpu:
                set_hostmem(view, edits, stage, memory)
            boundary = describe_boundary(view, edits, stage, memory, on_gpu, main_gpu)
        placement = StagePlacement(
            stage=stage.name, main_device=main_gpu, buffer_device_before=before,
            buffer_device_after=edits.device_of(buffer_node), device_changes=tuple(self.changes[stage.name]),
            boundary=tuple(boundary), copies=tuple(self.copies[stage.name]), kept=tuple(self.kept[stage.name]),
            notes=tuple(notes))
        return placement


__all__ = ["COPY_SCOPE", "GpuPlacement", "MAX_COPY_BYTES"]
