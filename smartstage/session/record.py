"""What a session's live rewrite did to a tf.Graph, kept per graph.

    record = live_rewrite_of(tf.compat.v1.get_default_graph())   # a LiveRewrite, or None
    record.tensor_map["hash:0"]                                  # the take output that carries it now
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from typing import Callable

import tensorflow as tf

_records: "weakref.WeakKeyDictionary[tf.Graph, LiveRewrite]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class LiveStage:
    """One stage rebuilt in the live graph: old and new op names by role, what moved, what crosses."""

    name: str
    old_ops: dict[str, str]
    new_ops: dict[str, str]
    moved: tuple[str, ...]
    boundary: tuple[str, ...]  # the tensors the new buffer carries, as the prefetch side names them
    folded_into: str = ""      # a stage folded into its dataset (passes/fold_dataset.py): the iterator op


@dataclass
class LiveRewrite:
    """What the session did to a live graph; the session maps fetches and feeds through it."""

    stages: tuple[LiveStage, ...] = ()
    notes: tuple[str, ...] = ()
    result: Any = None  # the OptimizeResult the edits came from
    tensor_map: dict[str, tf.Tensor] = field(default_factory=dict)  # old tensor name -> new tensor
    op_map: dict[str, tf.Operation] = field(default_factory=dict)  # old stage op name -> new op
    prefetch_nodes: dict[str, str] = field(default_factory=dict)  # node now on a prefetch side -> stage
    # ops built after the rewrite that read a prefetch-side tensor the stage does not carry -> why
    unservable: dict[str, str] = field(default_factory=dict)
    last_id: int = 0  # the graph's version at the rewrite: a larger version means ops were built since
    last_op_id: int = 0  # the largest op id at the rewrite (op ids run one ahead of Graph.version)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.stages)

    def summary(self) -> str:
        lines = [f"{s.name}: folded into the dataset of iterator {s.folded_into!r} ({len(s.moved)} op(s) in its map); "
                 f"the step reads {len(s.boundary)} tensor(s) from {s.new_ops['take']}" if s.folded_into else
                 f"{s.name}: moved {len(s.moved)} op(s) to the prefetch side; the stage now carries "
                 f"{len(s.boundary)} tensor(s) through {s.new_ops['put']} / {s.new_ops['take']}" for s in self.stages]
        return "\n".join(lines + list(self.notes)) or "no stage changed"


def live_rewrite_of(graph: tf.Graph) -> LiveRewrite | None:
    """The record of the rewrite a session made to `graph`, or None if none did."""
    return _records.get(graph)


def rewrite_once(graph: tf.Graph, rewrite: Callable[[], LiveRewrite]) -> tuple[LiveRewrite, bool]:
    """The graph's record, made by `rewrite()` the first time only (two sessions on one graph share it).

        rewrite_once(g, lambda: _apply(g, optimize(g)))   # (record, True); again: (the same record, False)
    """
    with _lock:
        record = _records.get(graph)
        if record is None:
            record = _records[graph] = rewrite()
            return record, True
        return record, False
