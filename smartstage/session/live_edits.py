"""The edit log (smartstage.graph.edits) written into a session's live tf.Graph, in place.

    before:  reader -> put ~~ take -> hash -> lookup(w)                  (the graph the user built)
    after:   apply_to_live_graph(graph, result_edits)
             reader -> hash -> put' ~~ take' -> lookup(w)                (the same tf.Graph object)

The passes' logs are the same ones apply_to_graph_def writes into a GraphDef; what a live graph cannot do
like a GraphDef is decided here, and only here:
- A live op's outputs, their dtypes and its number of inputs never change. When the log changes those of a
  queue's put or take (the boundary dtypes of a stage), the stage is built anew beside the old one:
  `<stage>/smart_stage/{buffer,put,take,close,cancel,size}`, each as the log leaves the old node, on its
  device; the new buffer gets a shared name of its own and the static shapes its put carries (when all are
  known). The old ops stay, unused; the old put is retired onto `<stage>/smart_stage/retired_buffer`, so
  no tool that finds stages by the graph's shape runs it. Every edit, StageDef (collection
  `smartstage_stages`) and QueueRunner that names an old op names the new one (`LiveEdits.renamed`).
  Any other op whose signature the log changes is refused (GraphError): no pass does that.
- New nodes and rebuilt ops are imported in one import_graph_def under their own names, every scope the
  caller may be in reset; inputs from live ops are mapped to the live tensors, control inputs added after.
- Every other edit is made on the live op: data inputs (Operation._update_input), control inputs, device,
  attributes. MoveToEnd means nothing without a node order. RemoveNode of a live op detaches it (ops cannot
  leave a tf.Graph): allowed only when, after the edits, every op that read it is removed too or reads
  something else, so no step runs it (fold_dataset removes a folded stage's buffer and body this way);
  RemoveStageDef drops the stage from the collection, so no runtime starts threads for it.
  tf.Graph); SetStageDef updates or adds the StageDef in the graph's collection.
All edits are checked against the graph before the first write (all or nothing, as in a GraphDef).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from smartstage.errors import GraphError
from smartstage.graph.edits import (AddFunction, AddNode, Edit, MoveToEnd, RemoveNode, RemoveStageDef, SetAttr,
                                    SetDevice, SetInputs, SetStageDef, dedupe_controls)
from smartstage.graph.names import parse_tensor_name
from smartstage.protos import StageDef
from smartstage.runtime.stage.metadata import STAGES_COLLECTION, StageRecord, add_stage_def, stage_defs

NEW_SCOPE = "smart_stage"
ROLES = ("buffer", "put", "take", "close", "cancel", "size")
STAGE_DEF_FIELDS = {"buffer": "buffer_node", "put": "put_node", "take": "take_node", "close": "close_node",
                    "cancel": "cancel_node", "size": "size_node"}
_PUTS = {"QueueEnqueueV2", "QueueEnqueue"}
_TAKES = {"QueueDequeueV2", "QueueDequeue"}


@dataclass(frozen=True)
class RebuiltStage:
    """One queue stage built anew: per role, the old op's name and the new one's."""

    name: str
    old_ops: dict[str, str]
    new_ops: dict[str, str]


@dataclass(frozen=True)
class LiveEdits:
    """What apply_to_live_graph did: ops built in place of old ones, nodes added, ops edited in place."""

    renamed: dict[str, str]          # old op name -> the op built in its place
    added: tuple[str, ...]           # nodes imported under their own names
    edited: tuple[str, ...]          # live ops edited in place
    stages: tuple[RebuiltStage, ...]  # queue stages built anew
    detached: tuple[str, ...] = ()   # live ops the log removes: they stay in the graph, read by nothing the step runs


def set_control_inputs(op: tf.Operation, control: Sequence[tf.Operation]) -> None:
    """Makes `control` (each op once, in order) the control inputs of `op`.

        before:  op waits on [a, b]            after:  set_control_inputs(op, [b, c, c]) -> op waits on [b, c]
    """
    by_name = {c.name: c for c in control}
    unique = [by_name[s[1:]] for s in dedupe_controls("^" + c.name for c in control)]  # the one dedupe rule
    op._remove_all_control_inputs()  # noqa: SLF001
    op._add_control_inputs(unique)  # noqa: SLF001


class _Net:
    """The net effect of a log on a live graph: each node's final inputs, device and attributes."""

    def __init__(self, graph: tf.Graph, edits: Sequence[Edit]):
        self.graph = graph
        self.added: dict[str, node_def_pb2.NodeDef] = {}
        self.inputs: dict[str, tuple[str, ...]] = {}
        self.devices: dict[str, str] = {}
        self.attrs: dict[str, dict[str, attr_value_pb2.AttrValue | None]] = {}
        self.stage_defs: dict[str, StageDef] = {}
        self.removed_stage_defs: set[str] = set()
        self.detached: dict[str, None] = {}  # live ops removed by the log, in log order
        self.functions: list = []
        for i, edit in enumerate(edits):
            where = f"edit {i} ({type(edit).__name__})"
            if isinstance(edit, AddNode):
                if edit.node.name in self.added or self.exists(edit.node.name):
                    raise GraphError(f"{where}: node {edit.node.name!r} is in the session's graph already; the "
                                     "log adds new names only (was the graph rewritten twice?)")
                copy = node_def_pb2.NodeDef()
                copy.CopyFrom(edit.node)
                self.added[copy.name] = copy
            elif isinstance(edit, (SetInputs, SetAttr, SetDevice)):
                node = self.added.get(edit.node)
                if node is None and not self.exists(edit.node):
                    raise GraphError(f"{where}: the session's graph has no node {edit.node!r}")
                if isinstance(edit, SetInputs):
                    if node is not None:
                        node.input[:] = edit.inputs
                    else:
                        self.inputs[edit.node] = edit.inputs
                elif isinstance(edit, SetDevice):
                    if node is not None:
                        node.device = edit.device
                    else:
                        self.devices[edit.node] = edit.device
                elif node is not None:
                    if edit.value is None:
                        node.attr.pop(edit.key, None)
                    else:
                        node.attr[edit.key].CopyFrom(edit.value)
                else:
                    self.attrs.setdefault(edit.node, {})[edit.key] = edit.value
            elif isinstance(edit, RemoveNode):
                if edit.node in self.added:
                    del self.added[edit.node]
                elif self.exists(edit.node):
                    self.detached[edit.node] = None
                else:
                    raise GraphError(f"{where}: the session's graph has no node {edit.node!r}")
            elif isinstance(edit, RemoveStageDef):
                self.removed_stage_defs.add(edit.name)
                self.stage_defs.pop(edit.name, None)
            elif isinstance(edit, AddFunction):
                self.functions.append(edit.function)
            elif isinstance(edit, SetStageDef):
                self.stage_defs[edit.stage_def.name] = edit.stage_def
            elif not isinstance(edit, MoveToEnd):  # no node order in a live graph
                raise GraphError(f"{where}: unknown edit kind {type(edit).__name__}")
        for name in self.detached:  # a detached op keeps what it read: no step runs it
            self.inputs.pop(name, None)
            self.devices.pop(name, None)
            self.attrs.pop(name, None)
        for name, inputs in [*self.inputs.items(), *((n.name, n.input) for n in self.added.values())]:
            for raw in inputs:
                source = parse_tensor_name(raw).node
                if source not in self.added and not self.exists(source):
                    raise GraphError(f"node {name!r} would read {raw!r}, and the session's graph has no such node "
                                     "after the edits")
                if source in self.detached and name not in self.detached:
                    raise GraphError(f"node {name!r} would read {raw!r}, which the edits remove")
        self._check_detached()

    def _check_detached(self) -> None:
        """Every op that reads a removed live op is removed too, or the log gives it other inputs."""
        for name in self.detached:
            op = self.graph.get_operation_by_name(name)
            readers = [c for out in op.outputs for c in out.consumers()] + list(op._control_outputs)  # noqa: SLF001
            for reader in readers:
                if reader.name in self.detached:
                    continue
                inputs = self.inputs.get(reader.name)
                if inputs is None or any(parse_tensor_name(raw).node == name for raw in inputs):
                    raise GraphError(f"the edits remove node {name!r}, which {reader.name!r} still reads in the "
                                     "session's graph; optimize the exported graph offline instead")

    def exists(self, name: str) -> bool:
        try:
            self.graph.get_operation_by_name(name)
        except KeyError:
            return False
        return True

    @property
    def changed(self) -> list[str]:
        """Existing nodes the log edits, in first-seen order."""
        return list(dict.fromkeys([*self.inputs, *self.devices, *self.attrs]))

    def final(self, name: str) -> node_def_pb2.NodeDef:
        """The NodeDef of live op `name` as the log leaves it."""
        node = node_def_pb2.NodeDef()
        node.CopyFrom(self.graph.get_operation_by_name(name).node_def)
        if name in self.inputs:
            node.input[:] = self.inputs[name]
        if name in self.devices:
            node.device = self.devices[name]
        for key, value in self.attrs.get(name, {}).items():
            if value is None:
                node.attr.pop(key, None)
            else:
                node.attr[key].CopyFrom(value)
        return node


def _signature_changes(op: tf.Operation, net: _Net) -> bool:
    """Whether the log changes the count or types of `op`'s inputs or outputs."""
    if op.name in net.inputs:
        data = [s for s in net.inputs[op.name] if not s.startswith("^")]
        if len(data) != len(op.inputs):
            return True
    changed = net.attrs.get(op.name, {})
    if not changed:
        return False
    keys = set()
    for arg in (*op.op_def.input_arg, *op.op_def.output_arg):
        keys.update(k for k in (arg.type_attr, arg.type_list_attr, arg.number_attr) if k)
    current = op.node_def.attr
    return any(key in keys and (value is None or key not in current or current[key] != value)
               for key, value in changed.items())


def _stage_roles(put: tf.Operation, takes: list[tf.Operation]) -> dict[str, tf.Operation]:
    """The ops of the queue stage `put` fills: its buffer, take, close, cancel and size."""
    roles = {"put": put, "buffer": put.inputs[0].op}
    readers = [t for t in takes if t.inputs[0].op is roles["buffer"]]
    if len(readers) != 1:
        raise GraphError(f"the edits change the put {put.name!r} of buffer {roles['buffer'].name!r}, which is "
                         f"read by {len(readers)} changed take op(s), not one; a live stage is rebuilt with one take")
    roles["take"] = readers[0]
    for op in roles["buffer"].outputs[0].consumers():
        if op.type in ("QueueCloseV2", "QueueClose"):
            roles.setdefault("cancel" if op.get_attr("cancel_pending_enqueues") else "close", op)
        elif op.type in ("QueueSizeV2", "QueueSize"):
            roles.setdefault("size", op)
    return roles


def _stage_name(put: str, stage_names: Mapping[str, str], graph: tf.Graph) -> str:
    if put in stage_names:
        return stage_names[put]
    for stage_def in stage_defs(graph):
        if stage_def.put_node == put:
            return stage_def.name
    return put.rpartition("/")[0] or put


def _rename_inputs(node: node_def_pb2.NodeDef, renamed: Mapping[str, str]) -> None:
    """`node` reads the ops built in place of renamed ones, and colocates with them."""
    for i, raw in enumerate(node.input):
        t = parse_tensor_name(raw)
        if t.node in renamed:
            node.input[i] = raw.replace(t.node, renamed[t.node], 1)
    if "_class" in node.attr:
        node.attr["_class"].list.s[:] = [b"loc:@" + renamed.get(c[5:].decode(), c[5:].decode()).encode()
                                         if c.startswith(b"loc:@") else c for c in node.attr["_class"].list.s]


def _tensor(graph: tf.Graph, raw: str) -> tf.Tensor:
    t = parse_tensor_name(raw)
    return graph.get_operation_by_name(t.node).outputs[t.port]


def _plan_stages(graph: tf.Graph, net: _Net, stage_names: Mapping[str, str]) -> list[tuple[str, dict]]:
    """The queue stages the log changes the signature of: (stage name, {role: old op})."""
    changing = {name for name in net.changed if _signature_changes(graph.get_operation_by_name(name), net)}
    ops = [graph.get_operation_by_name(n) for n in changing]
    stages = []
    for op in ops:
        if op.type in _PUTS:
            stages.append((_stage_name(op.name, stage_names, graph),
                           _stage_roles(op, [t for t in ops if t.type in _TAKES])))
    covered = {o.name for _, roles in stages for o in roles.values()}
    refused = sorted(changing - covered)
    if refused:
        op = graph.get_operation_by_name(refused[0])
        raise GraphError(f"the edits change the input or output types of node {op.name!r} ({op.type}), which a live "
                         "op cannot change (only a queue stage's ops are rebuilt); optimize the exported graph "
                         "offline instead")
    return stages


def _rebuilt_nodes(graph: tf.Graph, net: _Net, stages: list[tuple[str, dict]]
                   ) -> tuple[dict[str, str], list[node_def_pb2.NodeDef], list[RebuiltStage]]:
    """The renames, the new NodeDefs (each stage's ops as the log leaves them, plus a retired buffer)."""
    renamed: dict[str, str] = {}
    for name, roles in stages:
        for role, op in roles.items():
            renamed[op.name] = f"{name}/{NEW_SCOPE}/{role}"
    nodes, rebuilt = [], []
    for name, roles in stages:
        prefix = f"{name}/{NEW_SCOPE}"
        for role, op in roles.items():
            node = net.final(op.name)
            node.name = renamed[op.name]
            _rename_inputs(node, renamed)
            if role == "buffer":
                if node.attr["shared_name"].s:
                    node.attr["shared_name"].s = prefix.encode()
                put = net.final(roles["put"].name)
                carried = [s for s in put.input if not s.startswith("^")][1:]
                if not any(parse_tensor_name(s).node in net.added for s in carried):
                    shapes = [_tensor(graph, s).shape for s in carried]
                    known = all(s.is_fully_defined() for s in shapes)
                    node.attr["shapes"].list.Clear()
                    node.attr["shapes"].list.shape.extend(s.as_proto() for s in shapes if known)
            nodes.append(node)
        retired = node_def_pb2.NodeDef(name=f"{prefix}/retired_buffer", op="FIFOQueueV2", device=roles["put"].device)
        retired.attr["component_types"].CopyFrom(roles["buffer"].node_def.attr["component_types"])
        retired.attr["capacity"].i = 1
        nodes.append(retired)
        rebuilt.append(RebuiltStage(name, {r: op.name for r, op in roles.items()},
                                    {r: renamed[op.name] for r, op in roles.items()}))
    return renamed, nodes, rebuilt


def _import(graph: tf.Graph, nodes: list[node_def_pb2.NodeDef], functions: list) -> None:
    """Imports `nodes` (new names) with their devices; inputs from live ops mapped, control inputs added after."""
    if not nodes and not functions:
        return
    names = {n.name for n in nodes}
    input_map: dict[str, tf.Tensor] = {}
    outside_control: dict[str, list[str]] = {}
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    for function in functions:
        graph_def.library.function.add().CopyFrom(function)
    for node in nodes:
        copy = graph_def.node.add()
        copy.CopyFrom(node)
        del copy.input[:]
        for raw in node.input:
            t = parse_tensor_name(raw)
            if t.is_control and t.node not in names:
                outside_control.setdefault(node.name, []).append(t.node)
                continue
            copy.input.append(raw)
            if not t.is_control and t.node not in names:
                input_map[f"{t.node}:{t.port}"] = _tensor(graph, raw)
        if "_class" in copy.attr:  # colocation with a live op cannot be imported; the device is set below
            located = [c for c in copy.attr["_class"].list.s if not c.startswith(b"loc:@") or c[5:].decode() in names]
            if located:
                copy.attr["_class"].list.s[:] = located
            else:
                del copy.attr["_class"]
    with graph.as_default(), graph.device(None), graph.control_dependencies(None), graph.name_scope(None), \
            graph.colocate_with(None, ignore_existing=True):
        tf.graph_util.import_graph_def(graph_def, input_map=input_map or None, name="")
    for node in nodes:
        try:
            op = graph.get_operation_by_name(node.name)
        except KeyError:  # import_graph_def renames on a clash; only new names are imported
            raise GraphError(f"node {node.name!r} was not imported under its own name "
                             "(an optimizer bug; please report it)") from None
        op._set_device(node.device)  # noqa: SLF001  (colocation handling on import may have reset it)
        if node.name in outside_control:
            op._add_control_inputs([graph.get_operation_by_name(c) for c in outside_control[node.name]])  # noqa: SLF001


def _edit_in_place(graph: tf.Graph, net: _Net, name: str, renamed: Mapping[str, str]) -> None:
    op = graph.get_operation_by_name(name)
    if name in net.inputs:
        node = node_def_pb2.NodeDef(input=net.inputs[name])
        _rename_inputs(node, renamed)
        inputs = dedupe_controls(node.input)
        data = [s for s in inputs if not s.startswith("^")]
        for i, raw in enumerate(data):
            tensor = _tensor(graph, raw)
            if op.inputs[i] is not tensor:
                op._update_input(i, tensor)  # noqa: SLF001
        control = [graph.get_operation_by_name(s[1:]) for s in inputs if s.startswith("^")]
        if {c.name for c in control} != {c.name for c in op.control_inputs}:
            set_control_inputs(op, control)
    if name in net.devices:
        op._set_device(net.devices[name])  # noqa: SLF001
    for key, value in net.attrs.get(name, {}).items():
        if value is None:
            op._clear_attr(key)  # noqa: SLF001
        else:
            op._set_attr(key, value)  # noqa: SLF001


def _update_stage_defs(graph: tf.Graph, net: _Net, renamed: Mapping[str, str]) -> None:
    """The log's StageDefs in the collection (same name updated, new ones added, removed ones dropped);
    old op names re-pointed."""
    items = graph.get_collection_ref(STAGES_COLLECTION)
    if net.removed_stage_defs:
        items[:] = [item for item, stage_def in zip(list(items), stage_defs(graph))
                    if stage_def.name not in net.removed_stage_defs]
    defs = stage_defs(graph)
    by_name = {d.name: i for i, d in enumerate(defs)}
    for name, stage_def in net.stage_defs.items():
        if name in by_name:
            defs[by_name[name]].CopyFrom(stage_def)
        else:
            copy = StageDef()
            copy.CopyFrom(stage_def)
            add_stage_def(graph, copy)
    for i, stage_def in enumerate(stage_defs(graph)):
        fields = [f for f in STAGE_DEF_FIELDS.values() if getattr(stage_def, f) in renamed]
        for field in fields:
            setattr(stage_def, field, renamed[getattr(stage_def, field)])
        if (fields or stage_def.name in net.stage_defs) and not isinstance(items[i], StageRecord):
            items[i] = StageRecord(stage_def)  # raw bytes from an import: keep the updated proto


def _update_queue_runners(graph: tf.Graph, renamed: Mapping[str, str]) -> None:
    def new(op):
        return graph.get_operation_by_name(renamed[op.name]) if op is not None and op.name in renamed else op

    for qr in graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        if any(op.name in renamed for op in getattr(qr, "enqueue_ops", ())):
            qr._enqueue_ops = [new(op) for op in qr._enqueue_ops]  # noqa: SLF001
            qr._close_op, qr._cancel_op = new(qr._close_op), new(qr._cancel_op)  # noqa: SLF001


def apply_to_live_graph(graph: tf.Graph, edits: Sequence[Edit], stage_names: Mapping[str, str] | None = None
                        ) -> LiveEdits:
    """Writes `edits` (logs of passes run on an export of `graph`) into `graph` itself, in place.

        before:  hash(stage/take:0); stage/put(reader)             edits: expand_stage's log
        after:   hash(reader); stage/smart_stage/put(hash)          LiveEdits(renamed={"stage/put": ...}, ...)

    stage_names: the stage of each put (names the rebuilt ops); by default its StageDef's name, else its
    name scope. GraphError, before any write, for an edit the live graph cannot take.
    """
    net = _Net(graph, edits)
    stages = _plan_stages(graph, net, stage_names or {})
    renamed, rebuilt_nodes, rebuilt = _rebuilt_nodes(graph, net, stages)
    clash = [n.name for n in rebuilt_nodes if net.exists(n.name) or n.name in net.added]
    if clash:
        raise GraphError(f"node {clash[0]!r} is in the session's graph already; a stage is rebuilt once")
    added = list(net.added.values())
    for node in added:
        _rename_inputs(node, renamed)
    _import(graph, added + rebuilt_nodes, net.functions)
    in_place = [n for n in net.changed if n not in renamed]
    for name in in_place:
        _edit_in_place(graph, net, name, renamed)
    for stage in rebuilt:  # the old put fills a queue of its own from now on
        old_put = graph.get_operation_by_name(stage.old_ops["put"])
        old_put._update_input(0, graph.get_operation_by_name(f"{stage.name}/{NEW_SCOPE}/retired_buffer").outputs[0])  # noqa: SLF001
        take = graph.get_operation_by_name(stage.new_ops["take"])
        put = graph.get_operation_by_name(stage.new_ops["put"])
        for out, carried in zip(take.outputs, list(put.inputs)[1:]):
            out.set_shape(carried.shape)
    _update_stage_defs(graph, net, renamed)
    _update_queue_runners(graph, renamed)
    return LiveEdits(renamed, tuple(net.added), tuple(in_place), tuple(rebuilt), tuple(net.detached))


__all__ = ["LiveEdits", "NEW_SCOPE", "RebuiltStage", "ROLES", "apply_to_live_graph", "set_control_inputs"]
