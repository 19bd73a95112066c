"""The edit log: what a pass changes in a graph, as data, and the applier that writes it into a GraphDef.

    log = EditLog(view)                                   # view: the graph the pass read
    log.set_inputs("hash", ["reader"])                    # before: hash(stage/take)   after: hash(reader)
    log.set_attr("stage/buffer", "component_types", types([DT_INT64]))
    new_def = apply_to_graph_def(graph_def, log.edits, view)   # a new GraphDef; graph_def is not touched

A pass computes its edits, then one applier writes them, the way Grappler's `Mutation` collects changes
and applies all or none. The same log has three targets: a GraphDef copy (offline optimize(), here), a
session's live tf.Graph (smartstage.session.live_edits) and a TF2 function graph.

The edit kinds (frozen dataclasses; the NodeDef/AttrValue/FunctionDef/StageDef they hold are not to be
mutated once logged):

    AddNode(node, before="", after="")   a new node; `before`/`after` name an input-graph node it goes next to,
                                         else it goes at the end (GraphDef order only; a live graph has none)
    SetInputs(node, inputs)              every input of `node`, data then control ("^x"), in order
    SetAttr(node, key, value)            one attribute; value None removes it
    SetDevice(node, device)              the device string ("" clears it)
    RemoveNode(node)                     a node leaves the graph (nothing may read it afterwards)
    MoveToEnd(node)                      an existing node goes to the end (keeps a GraphDef topologically sorted)
    AddFunction(function)                a FunctionDef for the graph's library
    SetStageDef(stage_def)               the stage's StageDef as it is now (by name; new names add a stage)
    RemoveStageDef(name)                 the stage is gone (its buffer folded away): no StageDef, no threads

Worked example, one edit of each common kind on  a -> b ; c :

    [AddNode(NodeDef(name="n", op="Identity", input=["a"])), SetInputs("b", ("n", "^c")),
     SetDevice("c", "/device:CPU:0"), SetAttr("b", "T", AttrValue(type=DT_FLOAT))]
    gives  a -> n -> b (control input c, attr T) ; c@CPU:0 ; the node order is a, b, c, n.

All or nothing: every edit is checked before anything is written (a node that does not exist, an input
naming a missing node, an added name already taken, an anchor not in the graph), and a GraphError names
the edit and the node. The input GraphDef is never edited.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import input_source
from smartstage.graph.view import GraphView
from smartstage.protos import StageDef


@dataclass(frozen=True)
class AddNode:
    node: node_def_pb2.NodeDef
    before: str = ""
    after: str = ""

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class SetInputs:
    node: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class SetAttr:
    node: str
    key: str
    value: attr_value_pb2.AttrValue | None


@dataclass(frozen=True)
class SetDevice:
    node: str
    device: str


@dataclass(frozen=True)
class RemoveNode:
    node: str


@dataclass(frozen=True)
class MoveToEnd:
    node: str


@dataclass(frozen=True)
class AddFunction:
    function: function_pb2.FunctionDef


@dataclass(frozen=True)
class SetStageDef:
    stage_def: StageDef


@dataclass(frozen=True)
class RemoveStageDef:
    name: str


Edit = Union[AddNode, SetInputs, SetAttr, SetDevice, RemoveNode, MoveToEnd, AddFunction, SetStageDef, RemoveStageDef]
NODE_EDITS = (SetInputs, SetAttr, SetDevice, RemoveNode, MoveToEnd)


def dedupe_controls(inputs: Iterable[str], *, drop_read: bool = False) -> list[str]:
    """Data inputs in order, then each control input once; with drop_read, no control input on a node
    the data inputs read already (a data edge orders it anyway).

        before:  ["a", "^c", "b:1", "^c", "^a"]
        after:   ["a", "b:1", "^c", "^a"]      (drop_read: ["a", "b:1", "^c"])
    """
    inputs = list(inputs)
    data = [s for s in inputs if not s.startswith("^")]
    control = list(dict.fromkeys(s for s in inputs if s.startswith("^")))
    if drop_read:
        read = {input_source(s) for s in data}
        control = [s for s in control if s[1:] not in read]
    return data + control


def drop_colocation(log: "EditLog", names: Iterable[str], gone: set[str]) -> None:
    """Records, for each of `names` that stays, the removal of its colocation tags ("loc:@x" in `_class`)
    naming a node in `gone`: a node cut apart from the node it was colocated with would otherwise make
    import_graph_def fail ("expects to be colocated with unknown node").

        before:  Shape {_class: ["loc:@w/read"]}, gone = {"w/read"}
        after:   Shape (no _class)
    """
    for name in names:
        if name in gone:
            continue
        tags = log.attr_of(name, "_class")
        if tags is None:
            continue
        kept = [c for c in tags.list.s if not (c.startswith(b"loc:@") and c[5:].decode() in gone)]
        if len(kept) != len(tags.list.s):
            log.set_attr(name, "_class", attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=kept))
                         if kept else None)


class EditLog:
    """Edits collected while a pass plans, with what they change so far (later decisions see earlier ones).

        log = EditLog(view); log.set_device("hash", "/device:CPU:0")
        log.device_of("hash") == "/device:CPU:0"; log.edits == (SetDevice("hash", "/device:CPU:0"),)
    """

    def __init__(self, view: GraphView | None = None):
        self.view = view
        self._edits: list[Edit] = []
        self._inputs: dict[str, tuple[str, ...]] = {}
        self._devices: dict[str, str] = {}
        self._attrs: dict[str, dict[str, attr_value_pb2.AttrValue | None]] = {}
        self._added: dict[str, node_def_pb2.NodeDef] = {}
        self._reserved: set[str] = set()  # names unique_name() handed out

    @property
    def edits(self) -> tuple[Edit, ...]:
        return tuple(self._edits)

    @property
    def empty(self) -> bool:
        return not self._edits

    def _record(self, edit: Edit) -> None:
        if isinstance(edit, AddNode):
            self._added[edit.node.name] = edit.node
        elif isinstance(edit, SetInputs):
            self._inputs[edit.node] = edit.inputs
        elif isinstance(edit, SetDevice):
            self._devices[edit.node] = edit.device
        elif isinstance(edit, SetAttr):
            self._attrs.setdefault(edit.node, {})[edit.key] = edit.value
        self._edits.append(edit)

    # -- recording ---------------------------------------------------------------------------
    def add_node(self, node: node_def_pb2.NodeDef, *, before: str = "", after: str = "") -> None:
        self._record(AddNode(node, before, after))

    def set_inputs(self, node: str, inputs: Sequence[str]) -> None:
        self._record(SetInputs(node, tuple(inputs)))

    def set_attr(self, node: str, key: str, value: attr_value_pb2.AttrValue | None) -> None:
        self._record(SetAttr(node, key, value))

    def set_device(self, node: str, device: str) -> None:
        self._record(SetDevice(node, device))

    def remove_node(self, node: str) -> None:
        self._record(RemoveNode(node))

    def move_to_end(self, node: str) -> None:
        self._record(MoveToEnd(node))

    def add_function(self, function: function_pb2.FunctionDef) -> None:
        self._record(AddFunction(function))

    def set_stage_def(self, stage_def: StageDef) -> None:
        copy = StageDef()
        copy.CopyFrom(stage_def)
        self._record(SetStageDef(copy))

    def remove_stage_def(self, name: str) -> None:
        self._record(RemoveStageDef(name))

    # -- the graph as planned so far ----------------------------------------------------------
    def _node(self, name: str) -> node_def_pb2.NodeDef | None:
        if name in self._added:
            return self._added[name]
        if self.view is not None and name in self.view:
            return self.view.node(name)
        return None

    def inputs_of(self, name: str) -> tuple[str, ...]:
        if name in self._inputs:
            return self._inputs[name]
        if name in self._added:
            return tuple(self._added[name].input)
        return self.view.raw_inputs(name) if self.view is not None else ()

    def inputs_edited(self, name: str) -> bool:
        """Whether the log has set the inputs of `name` (an existing node)."""
        return name in self._inputs

    def device_of(self, name: str) -> str:
        if name in self._devices:
            return self._devices[name]
        node = self._node(name)
        return node.device if node is not None else ""

    def attr_of(self, name: str, key: str) -> attr_value_pb2.AttrValue | None:
        if key in self._attrs.get(name, {}):
            return self._attrs[name][key]
        node = self._node(name)
        return node.attr[key] if node is not None and key in node.attr else None

    def __contains__(self, name: str) -> bool:
        return name in self._added or (self.view is not None and name in self.view)

    def unique_name(self, wanted: str) -> str:
        """`wanted`, or `wanted_1`, `wanted_2`, ...: the first name neither the graph nor the log has (nor
        an earlier answer: the name is reserved for the node the caller is about to add)."""
        name, i = wanted, 1
        while name in self or name in self._reserved:
            name, i = f"{wanted}_{i}", i + 1
        self._reserved.add(name)
        return name


# -- the GraphDef applier -------------------------------------------------------------------------


def _kind(edit: Edit) -> str:
    return type(edit).__name__


def _check(graph_def: graph_pb2.GraphDef, edits: Sequence[Edit], view: GraphView | None) -> None:
    """GraphError for the first edit that cannot apply; nothing is written before every edit passed."""
    if view is not None and view.graph_def is not graph_def:
        view = None
    names = view if view is not None else {n.name for n in graph_def.node}
    added: set[str] = set()
    removed: set[str] = set()

    def exists(name: str) -> bool:
        return (name in added or name in names) and name not in removed

    for i, edit in enumerate(edits):
        where = f"edit {i} ({_kind(edit)})"
        if isinstance(edit, AddNode):
            name = edit.node.name
            if not name:
                raise GraphError(f"{where}: the added {edit.node.op or 'node'} has no name; give every new node one")
            if exists(name):
                raise GraphError(f"{where}: node {name!r} is in the graph already; choose a new name "
                                 "(EditLog.unique_name)")
            for anchor in (edit.before, edit.after):
                if anchor and (anchor not in names or anchor in removed):
                    raise GraphError(f"{where}: node {name!r} is placed next to {anchor!r}, which is not a node "
                                     "of the input graph; anchor it to one, or add it at the end")
            added.add(name)
        elif isinstance(edit, NODE_EDITS):
            if not exists(edit.node):
                raise GraphError(f"{where}: the graph has no node {edit.node!r}"
                                 + (" (removed by an earlier edit)" if edit.node in removed else "")
                                 + "; edit a node of the graph, or add it first")
            if isinstance(edit, RemoveNode):
                removed.add(edit.node)
                added.discard(edit.node)
    for i, edit in enumerate(edits):  # inputs may name nodes added later in the log
        if isinstance(edit, (AddNode, SetInputs)):
            node, inputs = (edit.node.name, edit.node.input) if isinstance(edit, AddNode) else (edit.node, edit.inputs)
            for raw in inputs:
                if not raw or not exists(input_source(raw)):
                    raise GraphError(f"edit {i} ({_kind(edit)}): node {node!r} would read {raw!r}, and the graph "
                                     "has no such node after the edits; name an existing node or add it first")


def apply_to_graph_def(graph_def: graph_pb2.GraphDef, edits: Sequence[Edit],
                       view: GraphView | None = None) -> graph_pb2.GraphDef:
    """A copy of `graph_def` with `edits` applied in order (all or none: GraphError before any write).

        before:  a -> b           edits: [AddNode(n(a)), SetInputs("b", ("n",))]
        after:   a -> n -> b      (nodes in the order a, b, n; graph_def unchanged)

    `view`, when it indexes `graph_def`, spares a sweep over the names. SetStageDef edits are not part
    of a GraphDef; stage_defs_after() applies them to a list of StageDefs.
    """
    _check(graph_def, edits, view)
    if view is None or view.graph_def is not graph_def:
        view = None
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    if view is not None:
        position = view.position
    else:
        index = {n.name: i for i, n in enumerate(new.node)}
        position = index.__getitem__
    added: dict[str, node_def_pb2.NodeDef] = {}
    tail: list[tuple[str, str]] = []  # ("add" | "move", name), in log order
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    removed: set[str] = set()
    moved: set[str] = set()

    def node(name: str) -> node_def_pb2.NodeDef:
        return added[name] if name in added else new.node[position(name)]

    for edit in edits:
        if isinstance(edit, AddNode):
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(edit.node)
            added[copy.name] = copy
            if edit.before:
                before.setdefault(edit.before, []).append(copy.name)
            elif edit.after:
                after.setdefault(edit.after, []).append(copy.name)
            else:
                tail.append(("add", copy.name))
        elif isinstance(edit, SetInputs):
            target = node(edit.node)
            del target.input[:]
            target.input.extend(edit.inputs)
        elif isinstance(edit, SetAttr):
            target = node(edit.node)
            if edit.value is None:
                if edit.key in target.attr:
                    del target.attr[edit.key]
            else:
                target.attr[edit.key].CopyFrom(edit.value)
        elif isinstance(edit, SetDevice):
            node(edit.node).device = edit.device
        elif isinstance(edit, RemoveNode):
            if edit.node in added:
                del added[edit.node]
            else:
                removed.add(edit.node)
        elif isinstance(edit, MoveToEnd):
            if edit.node in added:  # an added node moves from where it was placed to the end
                for placed in (*before.values(), *after.values()):
                    if edit.node in placed:
                        placed.remove(edit.node)
                tail = [(kind, name) for kind, name in tail if name != edit.node]
                tail.append(("add", edit.node))
            else:
                moved.add(edit.node)
                tail.append(("move", edit.node))
        elif isinstance(edit, AddFunction):
            new.library.function.add().CopyFrom(edit.function)
    tail = [(kind, name) for kind, name in tail if name in added or name in moved]
    if before or after:
        return _reordered(new, added, before, after, tail, removed, moved)
    # The common case edits in place: a few removals or moves, new nodes at the end.
    gone = sorted((position(n) for n in removed | moved), reverse=True)
    kept_moves = {}
    for index in gone:
        name = new.node[index].name
        if name in moved:
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(new.node[index])
            kept_moves[name] = copy
        del new.node[index]
    for kind, name in tail:
        new.node.append(added[name] if kind == "add" else kept_moves[name])
    return new


def _reordered(work: graph_pb2.GraphDef, added: dict, before: dict, after: dict, tail: list,
               removed: set[str], moved: set[str]) -> graph_pb2.GraphDef:
    """The nodes in their new order: anchored nodes next to their anchor, then the tail."""
    order = []
    by_name = {}
    for node in work.node:
        name = node.name
        by_name[name] = node
        order.extend(added[n] for n in before.get(name, ()) if n in added)
        if name not in removed and name not in moved:
            order.append(node)
        order.extend(added[n] for n in after.get(name, ()) if n in added)
    order.extend(added[name] if kind == "add" else by_name[name] for kind, name in tail)
    new = graph_pb2.GraphDef()
    new.CopyFrom(work)
    del new.node[:]
    new.node.extend(order)
    return new


def stage_defs_after(stage_defs: Sequence[StageDef], edits: Iterable[Edit]) -> list[StageDef]:
    """`stage_defs` with the log's SetStageDef edits applied: same name replaced, a new name appended;
    RemoveStageDef drops the stage of that name.

        before:  [StageDef(name="s", num_threads=1)]    edits: [SetStageDef(StageDef(name="s", num_threads=2))]
        after:   [StageDef(name="s", num_threads=2)]
    """
    result = list(stage_defs)
    for edit in edits:
        if isinstance(edit, RemoveStageDef):
            result = [d for d in result if d.name != edit.name]
        elif isinstance(edit, SetStageDef):
            names = [d.name for d in result]
            if edit.stage_def.name in names:
                result[names.index(edit.stage_def.name)] = edit.stage_def
            else:
                result.append(edit.stage_def)
    return result


def touched_nodes(edits: Iterable[Edit]) -> set[str]:
    """The names of the nodes the edits add, edit, move or remove (what a verifier re-checks)."""
    names = set()
    for edit in edits:
        if isinstance(edit, AddNode):
            names.add(edit.node.name)
        elif isinstance(edit, NODE_EDITS):
            names.add(edit.node)
    return names


__all__ = ["AddFunction", "AddNode", "drop_colocation", "Edit", "EditLog", "MoveToEnd", "RemoveNode", "SetAttr", "SetDevice",
           "SetInputs", "SetStageDef", "apply_to_graph_def", "dedupe_controls", "stage_defs_after",
           "touched_nodes"]
