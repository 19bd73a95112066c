"""A straightforward reference for the cut-cost rule (smartstage/passes/cut_cost.py): the rule as first written,
before it was made linear. Nothing is shared with the module but its constants and op sets.

    small(n):        every output of n has at most SMALL_ELEMENTS elements, by `_output_shapes`, by being a shape
                     source or a small Const, or (a metadata op, shape arithmetic) because every input it derives
                     from is small; a node on the walk's own path (a cycle through a queue) counts as not small
    candidates:      moved, not fixed, recomputable; then, until nothing changes, drop every candidate that a
                     moved non-candidate reads
    cut:             networkx's preflow_push on the whole flow network; recomputed = the candidates that reach
                     T in the residual graph
    costs:           both boundary costs, each in its own sweep

It asks the view for each fact as often as it needs it, and decides every node's smallness with a fresh walk
from each question: slow, and the thing the module must agree with.
"""

from __future__ import annotations

import networkx as nx

from smartstage.graph.names import CONTROL_PORT
from smartstage.graph.view import GraphView
from smartstage.passes import cut_cost as cc


class _Tensor:
    __slots__ = ("node", "port")

    def __init__(self, node: str, port: int):
        self.node, self.port = node, port


def elements(view: GraphView, node: str, port: int) -> int | None:
    shape = view.output_shape(_Tensor(node, port))
    if shape is None or shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        return None
    count = 1
    for d in shape.dim:
        count *= d.size
    return count


class Sizes:
    def __init__(self, view: GraphView):
        self.view = view
        self.verdicts: dict[str, bool] = {}
        self.visiting: set[str] = set()
        self.put_of: dict[str, str] = {}
        for name in view.names():
            if view.op(name) in cc._QUEUE_PUTS:
                buffer = view.data_inputs(name)[0].node
                for reader in view.consumers(buffer):
                    if view.op(reader) in cc._QUEUE_TAKES:
                        self.put_of[reader] = name

    def resolved(self, node: str, port: int, seen: frozenset = frozenset()) -> _Tensor:
        put = self.put_of.get(node)
        if put is not None and (node, port) not in seen:  # (as first written, a take its own put re-enqueues
            inputs = self.view.data_inputs(put)[1:]       # recursed without end)
            if port < len(inputs) and inputs[port].node in self.view:
                return self.resolved(inputs[port].node, inputs[port].port, seen | {(node, port)})
        return _Tensor(node, port)

    def carry(self, node: str, port: int) -> float:
        t = self.resolved(node, port)
        count = elements(self.view, t.node, t.port)
        if count is None:
            kb = 0.0 if self.small(t.node) else cc.UNKNOWN_KB
        else:
            kb = count * cc._DTYPE_BYTES.get(self.view.dtype_of(t), 8) / 1024
        return cc.CARRY_TENSOR + cc.CARRY_PER_KB * kb

    def small(self, name: str) -> bool:
        stack = [name]
        while stack:
            current = stack[-1]
            if current in self.verdicts:
                stack.pop()
                continue
            pending = [t.node for t in self.derived_from(current) if t.node not in self.verdicts]
            if pending and current not in self.visiting:
                self.visiting.add(current)
                stack.extend(pending)
                continue
            self.visiting.discard(current)
            self.verdicts[current] = self.verdict(current)
            stack.pop()
        return self.verdicts[name]

    def derived_from(self, name: str) -> list[_Tensor]:
        view = self.view
        op = view.op(name)
        dtypes = view.output_dtypes(name) or []
        if not dtypes or any(d not in cc._DTYPE_BYTES for d in dtypes) or op in cc._SHAPE_SOURCES or op == "Const":
            return []
        if all(elements(view, name, p) is not None for p in range(len(dtypes))):
            return []
        if op in ("Reshape", "ExpandDims", "Squeeze", "Identity", "StopGradient", "Snapshot"):
            return [self.resolved(t.node, t.port) for t in view.data_inputs(name)[:1] if t.node in view]
        if op in cc.SHAPE_ARITHMETIC_OPS and op not in cc._SIZE_FROM_VALUES:
            return [self.resolved(t.node, t.port) for t in view.data_inputs(name) if t.node in view]
        return []

    def verdict(self, name: str) -> bool:
        view = self.view
        op = view.op(name)
        dtypes = view.output_dtypes(name) or []
        counts = [elements(view, name, p) for p in range(len(dtypes))]
        if not dtypes or any(d not in cc._DTYPE_BYTES for d in dtypes):
            return False
        if all(c is not None for c in counts):
            return all(c <= cc.SMALL_ELEMENTS for c in counts)
        if op in cc._SHAPE_SOURCES:
            return True
        if op == "Const":
            dims = [d.size for d in view.node(name).attr["value"].tensor.tensor_shape.dim]
            count = 1
            for d in dims:
                count *= d
            return all(d >= 0 for d in dims) and count <= cc.SMALL_ELEMENTS
        data = self.derived_from(name)
        return bool(data) and all(self.verdicts.get(t.node, False) for t in data)


def recomputable(view: GraphView, name: str, sizes: Sizes) -> bool:
    op = view.op(name)
    if op in cc.METADATA_OPS:
        return True
    if op in cc.FILL_OPS:
        inputs = view.data_inputs(name)
        return all(i < len(inputs) and inputs[i].node in view
                   and sizes.small(sizes.resolved(inputs[i].node, inputs[i].port).node)
                   for i in cc._FILL_VALUE_INPUTS[op])
    return op in cc.SHAPE_ARITHMETIC_OPS and sizes.small(name)


def boundary_cost(view: GraphView, moved: set[str], take: str, anyway: set[str], sizes: Sizes,
                  recomputed) -> float:
    total = cc.RECOMPUTE_OP * len(recomputed)
    for src in [take, *moved]:
        if src in recomputed:
            continue
        ports = {p for c, _, p in view.fanouts(src)
                 if p != CONTROL_PORT and ((c not in moved and c != take) or c in recomputed)}
        ports |= {int(k.rpartition(":")[2]) for k in anyway if k.rpartition(":")[0] == src}
        total += sum(sizes.carry(src, p) for p in ports)
    return total


def plan_cut(view: GraphView, moved, take: str, *, fixed=(), crossing_anyway=()) -> dict:
    """The reference plan: {"recomputed": {node: reason}, "worth_moving", "reason", "cost_before", "cost_after"}."""
    moved = list(moved)
    moved_set = set(moved)
    sizes = Sizes(view)
    fixed = set(fixed)
    candidates = {n for n in moved if n not in fixed and recomputable(view, n, sizes)}
    changed = True
    while changed:
        changed = False
        for name in list(candidates):
            if any(f.consumer in moved_set and f.consumer not in candidates for f in view.fanouts(name)):
                candidates.discard(name)
                changed = True

    flow = nx.DiGraph()
    flow.add_node("S")
    flow.add_node("T")
    anyway = set(crossing_anyway)

    def producer_node(src):
        return ("n", src) if src in candidates else "S"

    def reader_node(consumer):
        if consumer in candidates:
            return ("n", consumer)
        return None if consumer in moved_set or consumer == take else "T"

    for src in [take, *moved]:
        readers: dict[int, list[str]] = {}
        for consumer, _, port in view.fanouts(src):
            if port != CONTROL_PORT:
                readers.setdefault(port, []).append(consumer)
        for port, consumers in readers.items():
            key = f"{src}:{port}"
            ends = {reader_node(c) for c in consumers} - {None}
            if not ends:
                continue
            if src not in candidates and ("T" in ends or key in anyway) and not (ends - {"T"}):
                continue
            flow.add_edge(producer_node(src), ("t", key), capacity=round(sizes.carry(src, port) * cc._SCALE))
            for end in ends:
                flow.add_edge(("t", key), end)
            if key in anyway:
                flow.add_edge(("t", key), "T")
    for name in candidates:
        flow.add_edge("S", ("n", name), capacity=round(cc.RECOMPUTE_OP * cc._SCALE))
        for consumer, _, _ in view.fanouts(name):
            if consumer in candidates:
                flow.add_edge(("n", consumer), ("n", name))

    recomputed: dict[str, str] = {}
    if candidates and flow.in_degree("T"):
        residual = nx.algorithms.flow.preflow_push(flow, "S", "T")
        main_side, todo = {"T"}, ["T"]
        while todo:
            v = todo.pop()
            for u in residual.predecessors(v):
                edge = residual[u][v]
                if u not in main_side and edge["capacity"] - edge["flow"] > 0:
                    main_side.add(u)
                    todo.append(u)
        for name in moved:
            if ("n", name) in main_side:
                recomputed[name] = cc._reason(view, name)
    work = [n for n in moved if n not in recomputed and not recomputable(view, n, sizes)]
    reason = ""
    if moved and not work:
        ops = sorted({view.op(n) for n in moved})
        reason = (f"nothing worth moving: the moved part is shape arithmetic only ({', '.join(ops[:6])}"
                  f"{', ...' if len(ops) > 6 else ''}), which cost the step less than a map or a buffer costs per "
                  "element")
    return {"recomputed": recomputed, "worth_moving": not reason, "reason": reason,
            "cost_before": boundary_cost(view, moved_set, take, anyway, sizes, {}),
            "cost_after": boundary_cost(view, moved_set, take, anyway, sizes, recomputed)}
