"""GraphDiff: what changed between two graphs, as data. Renderers (smartstage.inspection.render) draw it.

    before:  reader -> put ~~ take -> hash -> lookup(w)
    after:   reader -> hash -> put ~~ take -> lookup(w)
    graph_diff(before, after).moved == (MovedNode(name="hash", op="StringToHashBucketFast", stage="q",
                                                  to="prefetch", ...),)

Works for ANY two graphs: the stages of each are found with find_stages and every node gets a side
(smartstage.inspection.sides); a node moved when it is on a stage's prefetch side in one graph and on the main
side (or another stage's prefetch side) in the other. With the OptimizeResult that produced `after`,
the diff also lists every pinned node with its reason and the chain from the pinning cause.

A stage folded into its dataset (smartstage.passes.fold_dataset) has no buffer in the after graph: its nodes that
the fold put into the dataset's map function count as on its prefetch side, and the step's read of the iterator
is its boundary (`StageDiff.folded_into`). A partition at a graph's own inputs (a TF2 split) shows in no op: the
result names it, and its prefetch side in `after` is what its new boundary tensors need.

Order is deterministic: nodes in the order of the after graph (removed ones and those moved into a dataset's
map: of the before graph),
attributes by key, stages by where their take sits.

The JSON form (`to_dict()`, `from_dict()`), schema "smartstage.graph_diff", version SCHEMA_VERSION, is
documented field by field in docs/graph-diff-json.md. New optional keys may appear within a version;
renaming or removing a key, or changing its meaning, bumps the version.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from tensorflow.core.framework import graph_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import CONTROL_PORT, input_string
from smartstage.graph.stage_names import FOLDED_READ, folded_stage_of
from smartstage.graph.view import GraphView
from smartstage.graph.load import load_graph
from smartstage.inspection.chains import input_path
from smartstage.inspection.attr_text import attr_text
from smartstage.inspection.placement import StagePlacement, stage_placements
from smartstage.inspection.sides import FREE, MAIN, PREFETCH_PREFIX, GraphSides, sides_before_after, stage_of_side

SCHEMA = "smartstage.graph_diff"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NodeRef:
    """A node that was added or removed."""

    name: str
    op: str
    device: str = ""


@dataclass(frozen=True)
class MovedNode:
    """A node that crossed a stage: `to` is "prefetch" (onto `stage`'s prefetch side) or "main" (off it)."""

    name: str
    op: str
    stage: str
    to: str
    side_before: str
    side_after: str


@dataclass(frozen=True)
class PinnedNode:
    """A node the optimizer kept on `stage`'s main side, and why.

    via: the input it inherited the pin through (None: the node is the cause itself). When `via` is not
    itself pinned in this stage (it sits upstream of the take), `via_path` is the input path from `via`
    back to the cause. `GraphDiff.chain(name, stage)` joins these into the whole chain.
    """

    name: str
    op: str
    stage: str
    kind: str
    cause: str
    reason: str
    via: str | None = None
    via_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rewire:
    """A node whose inputs changed: data inputs in order, then control inputs ("^x") sorted."""

    name: str
    op: str
    before: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class ValueChange:
    """A node whose device (or op type) changed."""

    name: str
    before: str
    after: str


@dataclass(frozen=True)
class AttrChange:
    """One attribute of one node: before/after are short readable values; None when absent."""

    name: str
    attr: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class StageDiff:
    """One stage, matched across the two graphs by name (then by its put or take)."""

    name: str
    kind: str
    put: str
    take: str
    buffer: str = ""
    in_before: bool = True
    in_after: bool = True
    boundary_before: tuple[str, ...] = ()
    boundary_after: tuple[str, ...] = ()
    prefetch_nodes_before: int = 0
    prefetch_nodes_after: int = 0
    control_reroutes: tuple[tuple[str, str], ...] = ()
    skipped: str = ""  # the optimizer's reason for leaving the stage as it was ("" when unknown or applied)
    folded_into: str = ""  # the iterator read the step takes instead, when the stage was folded into its dataset


@dataclass(frozen=True)
class GraphDiff:
    """Everything that differs between `before` and `after`, with stage sides. See the module docstring."""

    before_nodes: int
    after_nodes: int
    stages: tuple[StageDiff, ...] = ()
    moved: tuple[MovedNode, ...] = ()
    pinned: tuple[PinnedNode, ...] = ()
    added: tuple[NodeRef, ...] = ()
    removed: tuple[NodeRef, ...] = ()
    rewired: tuple[Rewire, ...] = ()
    op_changes: tuple[ValueChange, ...] = ()
    device_changes: tuple[ValueChange, ...] = ()
    attr_changes: tuple[AttrChange, ...] = ()
    notes: tuple[str, ...] = ()
    has_pins: bool = False  # whether pins are known (an OptimizeResult was given)
    placement: tuple[StagePlacement, ...] = ()  # stages of the after graph placed on input tasks (scale-out)
    schema_version: int = SCHEMA_VERSION
    # Kept for drawing, never serialised: the side of every node of the after graph, and the graphs.
    sides_after: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    before_graph: graph_pb2.GraphDef | None = field(default=None, compare=False, repr=False)
    after_graph: graph_pb2.GraphDef | None = field(default=None, compare=False, repr=False)

    @property
    def is_empty(self) -> bool:
        return not (self.moved or self.added or self.removed or self.rewired or self.op_changes
                    or self.device_changes or self.attr_changes)

    def moved_in(self, stage: str, to: str = "prefetch") -> tuple[MovedNode, ...]:
        return tuple(m for m in self.moved if m.stage == stage and m.to == to)

    def pinned_in(self, stage: str) -> tuple[PinnedNode, ...]:
        return tuple(p for p in self.pinned if p.stage == stage)

    def chain(self, name: str, stage: str) -> tuple[str, ...]:
        """`name`, the input it inherited its pin through, ..., the cause: `name <- via <- ... <- cause`."""
        index = self._pin_index().get(stage, {})
        pin = index.get(name)
        if pin is None:
            return ()
        chain = [name]
        while pin.via is not None and pin.via not in chain:
            if pin.via in index:
                chain.append(pin.via)
                pin = index[pin.via]
                continue
            chain.extend(pin.via_path or (pin.via, pin.cause))
            break
        if chain[-1] != pin.cause:
            chain.append(pin.cause)
        return tuple(dict.fromkeys(chain))

    def _pin_index(self) -> dict[str, dict[str, PinnedNode]]:
        cached = self.__dict__.get("_pins_by_stage")
        if cached is None:
            cached = {}
            for p in self.pinned:
                cached.setdefault(p.stage, {})[p.name] = p
            object.__setattr__(self, "_pins_by_stage", cached)
        return cached

    def counts(self) -> dict[str, int]:
        return {
            "moved": len(self.moved), "pinned": len(self.pinned), "added": len(self.added),
            "removed": len(self.removed), "rewired": len(self.rewired), "op_changes": len(self.op_changes),
            "device_changes": len(self.device_changes), "attr_changes": len(self.attr_changes),
        }

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (docs/graph-diff-json.md); `json.dumps(d, indent=2)` writes it."""
        return {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "before": {"nodes": self.before_nodes},
            "after": {"nodes": self.after_nodes},
            "counts": self.counts(),
            "has_pins": self.has_pins,
            "stages": [_plain(s) for s in self.stages],
            "moved": [_plain(m) for m in self.moved],
            "pinned": [_plain(p) for p in self.pinned],
            "added": [_plain(n) for n in self.added],
            "removed": [_plain(n) for n in self.removed],
            "rewired": [_plain(r) for r in self.rewired],
            "op_changes": [_plain(c) for c in self.op_changes],
            "device_changes": [_plain(c) for c in self.device_changes],
            "attr_changes": [_plain(c) for c in self.attr_changes],
            "notes": list(self.notes),
            **({"placement": [p.to_dict() for p in self.placement]} if self.placement else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GraphDiff":
        """Reads the JSON form back (without the graphs: enough for text, JSON and the lists of the HTML)."""
        if d.get("schema") != SCHEMA:
            raise GraphError(f"not a GraphDiff JSON document (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        if d.get("schema_version") != SCHEMA_VERSION:
            raise GraphError(f"GraphDiff JSON schema_version {d.get('schema_version')!r} is not supported "
                             f"(this SmartStage reads version {SCHEMA_VERSION})")

        def build(kind, items, tuples=()):
            out = []
            for item in items:
                values = dict(item)
                for key in tuples:
                    if values.get(key) is not None:
                        values[key] = tuple(tuple(v) if isinstance(v, list) else v for v in values[key])
                out.append(kind(**values))
            return tuple(out)

        return cls(
            before_nodes=d["before"]["nodes"], after_nodes=d["after"]["nodes"],
            stages=build(StageDiff, d["stages"], ("boundary_before", "boundary_after", "control_reroutes")),
            moved=build(MovedNode, d["moved"]), pinned=build(PinnedNode, d["pinned"], ("via_path",)),
            added=build(NodeRef, d["added"]), removed=build(NodeRef, d["removed"]),
            rewired=build(Rewire, d["rewired"], ("before", "after")),
            op_changes=build(ValueChange, d["op_changes"]), device_changes=build(ValueChange, d["device_changes"]),
            attr_changes=build(AttrChange, d["attr_changes"]), notes=tuple(d.get("notes", ())),
            has_pins=bool(d.get("has_pins", False)),
            placement=tuple(StagePlacement.from_dict(p) for p in d.get("placement", ())),
        )


def _plain(obj) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[f.name] = value
    return out


# -- computing a diff ------------------------------------------------------------------------------
def graph_diff(before, after, result=None) -> GraphDiff:
    """The GraphDiff of two graphs (GraphDef, MetaGraphDef, tf.Graph or file path each).

    result: the OptimizeResult that turned `before` into `after`; adds pins with reasons and chains.

        before:  put(reader) ~~ take -> hash -> lookup(w)
        after:   put(hash) ~~ take -> lookup(w)       -> moved: hash to prefetch; rewired: put, hash, lookup
    """
    old, new = load_graph(before), load_graph(after)
    old_view, new_view = GraphView(old.graph_def), GraphView(new.graph_def)
    old_sides, new_sides = sides_before_after(old, new, old_view, new_view, result)

    added, rewired, op_changes, device_changes, attr_changes = [], [], [], [], []
    for node in new.graph_def.node:
        if node.name not in old_view:
            added.append(NodeRef(node.name, node.op, node.device))
            continue
        prior = old_view.node(node.name)
        if prior == node:
            continue
        if prior.op != node.op:
            op_changes.append(ValueChange(node.name, prior.op, node.op))
        inputs_before, inputs_after = _inputs(old_view, node.name), _inputs(new_view, node.name)
        if inputs_before != inputs_after:
            rewired.append(Rewire(node.name, node.op, inputs_before, inputs_after))
        if prior.device != node.device:
            device_changes.append(ValueChange(node.name, prior.device, node.device))
        for key in sorted(set(prior.attr) | set(node.attr)):
            a = prior.attr[key] if key in prior.attr else None
            b = node.attr[key] if key in node.attr else None
            if a != b:
                attr_changes.append(AttrChange(node.name, key, attr_text(a), attr_text(b)))
    folded = _folded_stages(old_sides, new_view)
    in_maps = _in_dataset_maps(old, new, old_sides, folded, result)
    removed = [NodeRef(n.name, n.op, n.device) for n in old.graph_def.node
               if n.name not in new_view and n.name not in in_maps]

    moved = _moved(new_view, old_sides, new_sides, folded) + [
        MovedNode(name, old_view.op(name), stage, "prefetch", old_sides.side.get(name, MAIN), PREFETCH_PREFIX + stage)
        for name, stage in in_maps.items()
        if _is_side(old_sides.side.get(name, FREE)) and old_sides.side[name] != PREFETCH_PREFIX + stage]
    stages = _stage_diffs(old_view, new_view, old_sides, new_sides, result, folded, in_maps)
    pinned = _pinned(old_view, result) if result is not None else []
    notes = tuple(dict.fromkeys(old_sides.notes + new_sides.notes))
    return GraphDiff(
        before_nodes=len(old_view), after_nodes=len(new_view), stages=tuple(stages), moved=tuple(moved),
        pinned=tuple(pinned), added=tuple(added), removed=tuple(removed), rewired=tuple(rewired),
        op_changes=tuple(op_changes), device_changes=tuple(device_changes), attr_changes=tuple(attr_changes),
        notes=notes, has_pins=result is not None, placement=stage_placements(None, new_view, new_sides),
        sides_after=dict(new_sides.side),
        before_graph=old.graph_def, after_graph=new.graph_def,
    )


def _inputs(view: GraphView, name: str) -> tuple[str, ...]:
    data = [input_string(t.node, t.port) for t in view.inputs(name) if t.port != CONTROL_PORT]
    control = sorted({"^" + t.node for t in view.inputs(name) if t.port == CONTROL_PORT})
    return tuple(data + control)


def _folded_stages(old: GraphSides, new_view: GraphView) -> dict[str, str]:
    """Stages of the before graph folded into their datasets in the after graph: stage -> the read the step takes."""
    reads = {folded_stage_of(name): name for name in new_view.names() if new_view.op(name) == FOLDED_READ}
    return {s.name: reads[s.name] for s in old.stages if s.name in reads and s.take not in new_view}


def _in_dataset_maps(old, new, old_sides: GraphSides, folded: Mapping[str, str], result) -> dict[str, str]:
    """Nodes of the before graph that a fold put into a dataset's map function (imported there as
    `body/<name>`), each with its stage: the folded stage whose prefetch nodes share its function, else the
    optimizer's partition that moved it, else the only folded stage."""
    if not folded:
        return {}
    known = {f.signature.name for f in old.graph_def.library.function}
    gone = {n.name for n in old.graph_def.node} - {n.name for n in new.graph_def.node}
    partition_of = {name: p.stage.name for p in (result.partitions if result is not None else ())
                    for name in p.moved}
    found: dict[str, str] = {}
    for function in new.graph_def.library.function:
        if function.signature.name in known:
            continue
        names = [n.name[len("body/"):] for n in function.node_def if n.name.startswith("body/")]
        names = [n for n in names if n in gone]
        sides = {stage_of_side(old_sides.side.get(n, MAIN)) for n in names} & set(folded)
        for name in names:
            stage = (next(iter(sides)) if len(sides) == 1 else partition_of.get(name)
                     or (next(iter(folded)) if len(folded) == 1 else ""))
            if stage:
                found[name] = stage
    return {n.name: found[n.name] for n in old.graph_def.node if n.name in found}  # in the before graph's order


def _moved(new_view: GraphView, old: GraphSides, new: GraphSides, folded: Mapping[str, str]) -> list[MovedNode]:
    moved = []
    for name in new_view.names():
        if name not in old.side:
            continue
        a, b = old.side[name], new.side[name]
        if a == b or a == FREE or b == FREE or not _is_side(a) or not _is_side(b):
            continue
        if stage_of_side(a) in folded and b == MAIN:
            continue  # the folded stage's iterator: the step reads it directly now, nothing moved
        op = new_view.op(name)
        if a.startswith(PREFETCH_PREFIX):  # left a prefetch side (to main, or to another stage's)
            moved.append(MovedNode(name, op, stage_of_side(a), "main", a, b))
        if b.startswith(PREFETCH_PREFIX):
            moved.append(MovedNode(name, op, stage_of_side(b), "prefetch", a, b))
    return moved


def _is_side(side: str) -> bool:
    return side == MAIN or side.startswith(PREFETCH_PREFIX)


def _stage_diffs(old_view, new_view, old: GraphSides, new: GraphSides, result, folded: Mapping[str, str],
                 in_maps: Mapping[str, str]) -> list[StageDiff]:
    partitions = {p.stage.name: p for p in result.partitions} if result is not None else {}
    pairs: list[tuple[Any, Any]] = []
    unmatched_old = list(old.stages)
    for stage in new.stages:
        match = next((s for s in unmatched_old if s.name == stage.name), None) or next(
            (s for s in unmatched_old if s.put == stage.put or s.take == stage.take), None)
        if match is not None:
            unmatched_old.remove(match)
        pairs.append((match, stage))
    pairs.extend((s, None) for s in unmatched_old)

    diffs = []
    for a, b in pairs:
        ref = b or a
        p = partitions.get(ref.name) or (partitions.get(a.name) if a is not None else None)
        read = folded.get(ref.name, "") if b is None else ""
        diffs.append(StageDiff(
            name=ref.name, kind=ref.kind, put=ref.put, take=ref.take, buffer=ref.buffer,
            in_before=a is not None, in_after=b is not None,
            boundary_before=_boundary(old_view, a),
            boundary_after=_read_outputs(new_view, read) if read else _boundary(new_view, b),
            prefetch_nodes_before=len(old.prefetch_nodes(a.name)) if a is not None else 0,
            prefetch_nodes_after=(sum(s == ref.name for s in in_maps.values()) if read else
                                  len(new.prefetch_nodes(b.name)) if b is not None else 0),
            control_reroutes=tuple(p.control_reroutes) if p is not None else (),
            skipped=p.skipped if p is not None else "", folded_into=read,
        ))
    return diffs


def _read_outputs(view: GraphView, read: str) -> tuple[str, ...]:
    count = len(view.node(read).attr["output_types"].list.type)
    return tuple(input_string(read, port) for port in range(count))


def _boundary(view: GraphView, stage) -> tuple[str, ...]:
    if stage is None:
        return ()
    return tuple(dict.fromkeys(str(t) for t in stage.put_data_inputs(view)))


def _pinned(view: GraphView, result) -> list[PinnedNode]:
    out = []
    for p in result.partitions:
        for name, pin in p.pinned.items():
            via_path: tuple[str, ...] = ()
            if pin.via is not None and pin.via not in p.pinned and pin.via != pin.cause:
                via_path = tuple(input_path(view, pin.via, pin.cause) or (pin.via, pin.cause))
            out.append(PinnedNode(name=name, op=view.op(name) if name in view else "", stage=p.stage.name,
                                  kind=pin.kind, cause=pin.cause, reason=pin.detail, via=pin.via,
                                  via_path=via_path))
    position = {n: i for i, n in enumerate(view.names())}
    stage_rank = {p.stage.name: i for i, p in enumerate(result.partitions)}
    out.sort(key=lambda pn: (stage_rank[pn.stage], position.get(pn.name, len(position)), pn.name))
    return out
