"""What the picture shows: boxes in clusters and the edges between them, collapsed by name scope.

    diff (after graph: reader -> hash -> put ~~ take -> lookup(w))
    -> Drawing(clusters=[prefetch:q, main],
               boxes=[reader, hash (moved), put, take, lookup, w],
               edges=[reader->hash, hash->put "hash:0", put->take "1 tensor: hash:0", ...])

The after graph is drawn: one cluster per stage's prefetch side, one for the main side, the stage's put
at the end of its prefetch cluster and its take at the start of the main one, joined by an edge that
carries the boundary tensors. Other stage ops (buffer, close, readiness guard) and free nodes (constants
and what is computed from them only) are left out: they are on no side.

Large graphs: each cluster starts as its top-level name scopes, and scopes are opened one by one (those
holding moved nodes first, then the largest) while the picture stays within `max_boxes`; a scope that is
not opened is one box labelled with its node count. 100,000 nodes give the same few dozen boxes.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from smartstage.inspection.diff import GraphDiff
from smartstage.errors import GraphError
from smartstage.graph.names import CONTROL_PORT
from smartstage.graph.view import GraphView
from smartstage.inspection.sides import FREE, MAIN, PREFETCH_PREFIX, STAGE_PREFIX, partial_topological_order

DEFAULT_MAX_BOXES = 80
MAX_NAMES_PER_BOX = 200  # names kept per box for search; a box's scope matches the rest
MAX_LABEL_TENSORS = 4


@dataclass(frozen=True)
class Cluster:
    id: str
    side: str  # "prefetch:<stage>" or "main"
    label: str


@dataclass(frozen=True)
class Box:
    """One drawn box: a node, or a collapsed name scope (`scope` ends with "/")."""

    id: str
    cluster: str
    label: str
    op: str = ""  # op type of a single node; "" for a scope
    scope: str = ""
    size: int = 1
    moved: int = 0
    pinned: int = 0
    role: str = "node"  # node | scope | put | take
    names: tuple[str, ...] = ()
    order: int = 0  # position of the first member in the graph's topological order

    @property
    def subtitle(self) -> str:
        if self.role in ("put", "take"):
            return f"{self.role} ({self.op})"
        if self.role == "scope":
            extra = f", {self.moved} moved" if self.moved else ""
            return f"{self.size} nodes{extra}"
        return self.op


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    count: int = 1
    control: bool = False
    label: str = ""
    boundary: bool = False  # put -> take: what the buffer carries


@dataclass(frozen=True)
class Drawing:
    clusters: tuple[Cluster, ...]
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    total_nodes: int
    drawn_nodes: int
    collapsed: bool
    hidden: int = 0  # stage ops and free nodes left out
    boxes_by_id: dict = field(default_factory=dict, compare=False, repr=False)

    def box(self, box_id: str) -> Box:
        return self.boxes_by_id[box_id]


def build_drawing(diff: GraphDiff, max_boxes: int = DEFAULT_MAX_BOXES) -> Drawing:
    """The Drawing of `diff`'s after graph (GraphError-free: a diff read from JSON has no graph to draw)."""
    if diff.after_graph is None:
        raise ValueError("this GraphDiff carries no graph to draw (it was read from JSON); compute it with "
                         "graph_diff(before, after) to draw it")
    view = GraphView(diff.after_graph)
    sides = diff.sides_after
    try:
        topological = view.topological_order()
    except GraphError:  # a cycle TensorFlow would reject too: draw what is not on it in order, the rest last
        topological = partial_topological_order(view)
    order = {n: i for i, n in enumerate(topological)}
    moved = {m.name for m in diff.moved}
    pinned = {p.name for p in diff.pinned}
    stage_names = [s.name for s in diff.stages if s.in_after]

    clusters = [Cluster(f"cluster_prefetch_{i}", PREFETCH_PREFIX + name, f"prefetch side of stage '{name}'")
                for i, name in enumerate(stage_names)]
    clusters.append(Cluster("cluster_main", MAIN, "main side"))
    cluster_of_side = {c.side: c.id for c in clusters}

    members: dict[str, list[str]] = defaultdict(list)
    hidden = 0
    for name in view.names():
        side = sides.get(name, MAIN)
        if side == FREE or side.startswith(STAGE_PREFIX) or side not in cluster_of_side:
            hidden += 1
            continue
        members[cluster_of_side[side]].append(name)

    boxes: list[Box] = []
    box_of: dict[str, str] = {}
    for stage in diff.stages:
        if not stage.in_after:
            continue
        i = stage_names.index(stage.name)
        for role, name, cluster in (("put", stage.put, f"cluster_prefetch_{i}"), ("take", stage.take, "cluster_main")):
            if name in view:
                box_id = f"ss_{role}{i}"
                boxes.append(Box(box_id, cluster, name, op=view.op(name), role=role, names=(name,),
                                 order=order.get(name, len(order))))
                box_of[name] = box_id
    hidden -= len(boxes)  # the puts and takes are stage ops, but drawn
    budget = max(max_boxes - len(boxes), len(clusters))
    total = sum(len(v) for v in members.values()) or 1
    collapsed = False
    for cluster in clusters:
        names = members.get(cluster.id, [])
        # Half the budget is shared equally (the prefetch sides are small but the point of the picture),
        # half in proportion to size.
        share = max(4, budget // (2 * len(clusters)) + budget * len(names) // (2 * total)) if names else 0
        entries = _collapse(names, share, moved)
        collapsed |= any(e.is_scope for e in entries)
        for k, entry in enumerate(entries):
            box_id = f"ss_{cluster.id[8:]}_{k}"
            member_names = entry.names
            for n in member_names:
                box_of[n] = box_id
            ops = {view.op(n) for n in member_names}
            boxes.append(Box(
                id=box_id, cluster=cluster.id,
                label=entry.label, op=ops.pop() if not entry.is_scope and len(ops) == 1 else "",
                scope=entry.scope if entry.is_scope else "", size=len(member_names),
                moved=sum(n in moved for n in member_names), pinned=sum(n in pinned for n in member_names),
                role="scope" if entry.is_scope else "node", names=tuple(member_names[:MAX_NAMES_PER_BOX]),
                order=min(order.get(n, len(order)) for n in member_names),
            ))

    edges = _edges(view, box_of, diff)
    boxes.sort(key=lambda b: (b.cluster, b.order, b.id))
    return Drawing(clusters=tuple(clusters), boxes=tuple(boxes), edges=tuple(edges), total_nodes=len(view),
                   drawn_nodes=len(view) - hidden, collapsed=collapsed, hidden=hidden,
                   boxes_by_id={b.id: b for b in boxes})


def _edges(view: GraphView, box_of: dict[str, str], diff: GraphDiff) -> list[Edge]:
    counts: dict[tuple[str, str], list] = {}
    puts = frozenset(s.put for s in diff.stages if s.in_after)
    for dst in view.names():
        b_dst = box_of.get(dst)
        if b_dst is None:
            continue
        for t in view.inputs(dst):
            b_src = box_of.get(t.node)
            if b_src is None or b_src == b_dst:
                continue
            entry = counts.setdefault((b_src, b_dst), [0, True, []])
            entry[0] += 1
            entry[1] &= t.port == CONTROL_PORT
            if dst in puts and t.port != CONTROL_PORT:
                entry[2].append(str(t))
    edges = [Edge(src, dst, count=c, control=control, label=_tensor_label(tensors))
             for (src, dst), (c, control, tensors) in counts.items()]
    drawn = set(box_of.values())
    for i, stage in enumerate(s for s in diff.stages if s.in_after):
        if f"ss_put{i}" in drawn and f"ss_take{i}" in drawn:
            n = len(stage.boundary_after)
            edges.append(Edge(f"ss_put{i}", f"ss_take{i}", count=n, label=f"{n} tensor{'s' if n != 1 else ''}: "
                              + _tensor_label(stage.boundary_after, sep=", "), boundary=True))
    edges.sort(key=lambda e: (e.src, e.dst))
    return edges


def _tensor_label(tensors, sep: str = "\n") -> str:
    tensors = list(dict.fromkeys(tensors))
    shown = tensors[:MAX_LABEL_TENSORS]
    more = len(tensors) - len(shown)
    return sep.join(shown) + (f"{sep}+{more} more" if more else "")


# -- collapsing by name scope ----------------------------------------------------------------------
@dataclass
class _Scope:
    path: str  # "" for the root, else "a/b"
    own: str | None = None  # the node named exactly `path`, if any
    children: dict = field(default_factory=dict)
    size: int = 0
    names: list = field(default_factory=list)  # every node at or under this scope, in graph order
    rest: bool = False  # the children of `path` that did not fit, as one box

    def child(self, part: str) -> "_Scope":
        if part not in self.children:
            self.children[part] = _Scope(f"{self.path}/{part}" if self.path else part)
        return self.children[part]


def _partial(scope: _Scope, children: list, room: int, priority, rest_of) -> list:
    """The `room - 1` most important children (moved nodes first, then the largest), and one box for the rest."""
    def key(item):
        return priority(item) if isinstance(item, _Scope) else (0, -1, item)

    kept = sorted(children, key=key)[:room - 1]
    return kept + [rest_of(scope, kept)]


@dataclass(frozen=True)
class _Entry:
    label: str
    scope: str
    names: list
    is_scope: bool


def _collapse(names: list[str], max_entries: int, moved: set[str] = frozenset()) -> list[_Entry]:
    """The boxes of one cluster: name scopes opened greedily (those holding moved nodes first, then the
    largest) while the count stays within max_entries."""
    root = _Scope("")
    for name in names:
        node = root
        node.names.append(name)
        for part in name.split("/"):
            node = node.child(part)
            node.names.append(name)
        node.own = name

    def opened(scope: _Scope) -> list[_Scope | str]:
        items: list[_Scope | str] = [scope.own] if scope.own is not None else []
        items.extend(scope.children[k] for k in scope.children)
        return items

    def as_item(scope: _Scope):
        # A scope holding one node is that node; a chain of single-child scopes opens for free.
        while scope.own is None and len(scope.children) == 1:
            scope = next(iter(scope.children.values()))
        if len(scope.names) == 1:
            return scope.names[0]
        return scope

    def priority(scope: _Scope) -> tuple:
        return (-sum(n in moved for n in scope.names), -len(scope.names), scope.path)

    def rest_of(scope: _Scope, kept: list) -> _Scope:
        """One box for the children of `scope` that did not fit: "<scope>/ (k more)"."""
        kept_names = {n for k in kept for n in ([k] if isinstance(k, str) else k.names)}
        rest = _Scope(scope.path, rest=True)
        rest.names = [n for n in scope.names if n not in kept_names]
        return rest

    items: list[_Scope | str] = [as_item(s) if isinstance(s, _Scope) else s for s in opened(root)]
    if len(items) > max_entries:  # even the top level does not fit: keep the largest, group the rest
        items = _partial(root, items, max_entries, priority, rest_of)
    heap = [priority(s) for s in items if isinstance(s, _Scope) and not s.rest]
    by_path = {s.path: s for s in items if isinstance(s, _Scope) and not s.rest}
    heapq.heapify(heap)
    count = len(items)
    while heap:
        *_, path = heapq.heappop(heap)
        scope = by_path.pop(path)
        children = [as_item(s) if isinstance(s, _Scope) else s for s in opened(scope)]
        room = max_entries - count + 1
        if len(children) > room:
            if room < 3:
                continue  # stays closed
            children = _partial(scope, children, room, priority, rest_of)
        count += len(children) - 1
        items = [x for x in items if x is not scope] + children
        for c in children:
            if isinstance(c, _Scope) and not c.rest:
                by_path[c.path] = c
                heapq.heappush(heap, priority(c))
    entries = []
    for item in items:
        if isinstance(item, str):
            entries.append(_Entry(item, "", [item], False))
        elif item.rest:
            label = (item.path + "/" if item.path else "") + "(other scopes)"
            entries.append(_Entry(label, item.path + "/" if item.path else "", item.names, True))
        else:
            entries.append(_Entry(item.path + "/", item.path + "/", item.names, True))
    position = {n: i for i, n in enumerate(names)}
    entries.sort(key=lambda e: position[e.names[0]])
    return entries
