"""Which nodes must stay on the main side, and why (analysis only).

A *pin source* is a node that can never move to the prefetch side: it reads or writes trainable or
mutable state, is fed, is control flow, is a target, is another input op or stage, or its op type is
unknown. Anything that depends on a pin source (through data or control edges) stays too; `Pin.via`
records the input through which it inherited the pin, so `explain` can print the chain:

    lookup  -- pinned: reads variable 'emb/w' (via 'emb/w/read')
    loss    -- pinned: reads variable 'emb/w' (via 'lookup')

A *free* node is stateless and depends on nothing pinned or stateful (constants and what is computed
from them only): either side may evaluate it, so it never crosses a boundary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from smartstage.graph.view import GraphView
from smartstage.graph.op_types import PY_FUNC_OPS, is_stateful_op, op_def
from smartstage.graph.op_types import CONTROL_FLOW_OPS, FEED_OPS, FUNCTIONAL_OPS, INPUT_OPS, MOVABLE_STATEFUL_OPS, MUTABLE_STATE_OPS, READ_ONLY_TABLE_OPS, STAGE_OPS, TABLE_READ_OPS, VARIABLE_OPS, VARIABLE_READ_OPS


# Attributes that name the functions a functional op calls.
_FUNCTION_ATTRS = ("then_branch", "else_branch", "cond", "body", "f", "branches")


@dataclass(frozen=True)
class Pin:
    """Why a node stays on the main side.

    kind: variable, mutable_state, feed, control_flow, target, fetched_directly, input_op, other_stage,
    stateful, unknown_op, function_state, recompute (cut_cost.py: cheaper on the main side than carried). cause: the node at the root of the reason. via: the input
    this node inherited the pin through (None for the cause itself). detail: a sentence about the cause.
    """

    kind: str
    cause: str
    detail: str
    via: str | None = None

    def inherited(self, via: str) -> "Pin":
        return Pin(self.kind, self.cause, self.detail, via)

    def describe(self) -> str:
        return self.detail if self.via is None else f"{self.detail} (via {self.via!r})"


class PinRules:
    """Classifies nodes as pin sources, free, or neither, for one graph and one set of targets/feeds."""

    def __init__(self, view: GraphView, targets: set[str], feeds: set[str], stage_ops: set[str]):
        self.view = view
        self.targets = targets
        self.feeds = feeds
        self.stage_ops = stage_ops
        self._functions = {f.signature.name: f for f in view.graph_def.library.function}
        self._function_verdict: dict[str, str | None] = {}
        self._source: dict[str, Pin | None] = {}
        self._special = targets | feeds | stage_ops
        self._taint: dict[str, Pin] = {}
        self._free: dict[str, bool] = {}

    # -- pin sources ---------------------------------------------------------------------------
    def source(self, name: str) -> Pin | None:
        """The pin of `name` itself, from its op type and role; None if its type allows moving."""
        if name in self._source:
            return self._source[name]
        op = self.view.op(name)
        if (name not in self._special and op not in VARIABLE_READ_OPS and op not in FUNCTIONAL_OPS
                and op not in self._functions and _op_verdict(op) is None):
            return None  # the common case, decided by the op type alone
        pin = self._source[name] = self._classify(name)
        return pin

    def _classify(self, name: str) -> Pin | None:
        op = self.view.op(name)
        if name in self.targets:
            verdict = _op_verdict(op)
            if verdict is not None and verdict[0] == "stateful":  # a print, a py_function: its effect is the point
                return Pin("stateful", name, verdict[1].format(name=repr(name), op=op))
            return Pin("target", name, f"{name!r} is a target (fetched by the training step)")
        if name in self.feeds:
            return Pin("feed", name, f"{name!r} is fed ({op})")
        if name in self.stage_ops:
            return Pin("other_stage", name, f"{name!r} belongs to another stage or queue ({op})")
        if op in VARIABLE_READ_OPS:
            handle = self.view.inputs(name)[:1]
            variable = handle[0].node if handle else name
            return Pin("variable", variable if handle else name, f"reads variable {variable!r}")
        if op in FUNCTIONAL_OPS or op in self._functions:
            reason = self._functions_reason(self.view.node(name))
            return None if reason is None else Pin("function_state", name, f"{name!r} calls a function that {reason}")
        verdict = _op_verdict(op)
        if verdict is None:
            return None
        kind, template = verdict
        return Pin(kind, name, template.format(name=repr(name), op=op))

    def _functions_reason(self, node) -> str | None:
        names = _called_functions(node)
        if node.op in self._functions:
            names.append(node.op)
        for fname in names:
            if fname not in self._function_verdict:
                self._function_verdict[fname] = None  # breaks recursion
                self._function_verdict[fname] = self._function_body_reason(fname)
            if self._function_verdict[fname]:
                return self._function_verdict[fname]
        return None

    def _function_body_reason(self, fname: str) -> str | None:
        fdef = self._functions.get(fname)
        if fdef is None:
            return f"is not in the graph's function library ({fname!r})"
        for n in fdef.node_def:
            od = op_def(n.op)
            if n.op in VARIABLE_OPS or n.op in VARIABLE_READ_OPS or n.op in MUTABLE_STATE_OPS:
                return f"touches state ({fname}/{n.name}: {n.op})"
            if n.op in INPUT_OPS or n.op in STAGE_OPS:
                return f"reads input ({fname}/{n.name}: {n.op})"
            if n.op in FUNCTIONAL_OPS or n.op in self._functions:
                inner = self._functions_reason(n)
                if inner:
                    return inner
                continue
            if od is None:
                return f"runs op type {n.op!r} unknown to this TensorFlow ({fname}/{n.name})"
            if od.is_stateful and n.op not in MOVABLE_STATEFUL_OPS:
                return f"runs stateful op {n.op} ({fname}/{n.name})"
        return None

    # -- free nodes ------------------------------------------------------------------------------
    def is_free(self, name: str) -> bool:
        """Stateless (or a read-only table handle), not a pin source, and every input free: both sides may
        evaluate it. Computed on demand, so only the nodes a partition asks about are visited."""
        verdict = self._free.get(name)
        if verdict is not None:
            return verdict
        stack = [name]
        while stack:
            current = stack[-1]
            if current in self._free:
                stack.pop()
                continue
            if not self._free_by_type(current):
                self._free[current] = False
                stack.pop()
                continue
            inputs = self.view.inputs(current)
            pending = next((t.node for t in inputs if t.node not in self._free), None)
            if pending is not None:
                if pending not in self.view:
                    self._free[pending] = False
                elif pending in stack:
                    self._free[current] = False  # a loop: never free
                    stack.pop()
                else:
                    stack.append(pending)
                continue
            self._free[current] = all(self._free[t.node] for t in inputs)
            stack.pop()
        return self._free[name]

    def _free_by_type(self, name: str) -> bool:
        op = self.view.op(name)
        stateful = is_stateful_op(op)
        if stateful is None or (stateful and op not in READ_ONLY_TABLE_OPS and op not in TABLE_READ_OPS):
            return False  # a table read is free when its table is (a read-only table) and so are its keys
        if op in FUNCTIONAL_OPS or op in self._functions or op in FEED_OPS or op in CONTROL_FLOW_OPS:
            return False
        if name in self.targets or name in self.feeds or name in self.stage_ops:
            return False
        return self.source(name) is None

    def taint(self, name: str) -> Pin:
        """Why a node that is neither free nor behind the stage cannot feed the prefetch side."""
        if name in self._taint:
            return self._taint[name]
        stack = [name]
        while stack:
            current = stack[-1]
            if current in self._taint:
                stack.pop()
                continue
            own = self.source(current)
            if own is not None:
                self._taint[current] = own
                stack.pop()
                continue
            blockers = [t.node for t in self.view.inputs(current) if not self.is_free(t.node)]
            pending = [b for b in blockers if b not in self._taint]
            if pending:
                stack.extend(pending[:1])
                continue
            if blockers:
                self._taint[current] = self._taint[blockers[0]].inherited(blockers[0])
            else:
                op = self.view.op(current)
                self._taint[current] = Pin("stateful", current, f"{current!r} is a stateful op ({op}) that runs outside this stage's prefetch side")
            stack.pop()
        return self._taint[name]


@functools.lru_cache(maxsize=None)
def _op_verdict(op: str) -> tuple[str, str] | None:
    """(kind, detail template) when every node of type `op` is a pin source; None when the type may move."""
    if op in PY_FUNC_OPS:
        return "stateful", "{name} runs Python ({op}: a py_function or numpy_function), which may read or change the interpreter's state"
    if op in FEED_OPS:
        return "feed", "{name} is fed ({op})"
    if op in VARIABLE_OPS:
        return "variable", "reads variable {name}"
    if op in MUTABLE_STATE_OPS:
        return "mutable_state", "touches mutable state {name} ({op})"
    if op in CONTROL_FLOW_OPS:
        return "control_flow", "{name} is control flow ({op})"
    if op in STAGE_OPS:
        return "other_stage", "{name} belongs to another stage or queue ({op})"
    if op in INPUT_OPS:
        return "input_op", "{name} is an input op ({op}) not behind this stage"
    od = op_def(op)
    if od is None:
        return "unknown_op", "{name} has op type {op!r}, unknown to this TensorFlow: it may be stateful"
    if (any(a.is_ref for a in od.output_arg) or any(a.is_ref for a in od.input_arg)) and op not in ("Identity", "RefIdentity"):
        return "variable", "{name} takes or gives a ref (legacy variable) tensor"
    if od.is_stateful and op not in MOVABLE_STATEFUL_OPS:
        return "stateful", "{name} is a stateful op ({op}) with effects outside the batch"
    return None


def _called_functions(node) -> list[str]:
    names: list[str] = []
    for key in _FUNCTION_ATTRS:
        if key in node.attr:
            value = node.attr[key]
            if value.HasField("func"):
                names.append(value.func.name)
            names.extend(f.name for f in value.list.func)
    return names
