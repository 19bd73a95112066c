"""The head/body split of one stage's prefetch side on the live tf.Graph (analysis only; builds nothing).

    before:  GetNext -> decode -> hash -> put
    after:   PrefetchSplit(head_ops={GetNext}, cut=(GetNext:0,), head_targets=())   # body {decode, hash}

The rule is graph/heads.py's LANES rule, shared with the input_tasks pass: the head is what must run once
per batch, in order; lanes run the body side by side in this process, sharing the head's handles.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from smartstage.graph.heads import LANES, close_head
from smartstage.graph.op_types import HANDLE_OPS, UNFEEDABLE_DTYPES


@dataclass(frozen=True)
class PrefetchSplit:
    """The head/body split of one stage's prefetch side (analysis only; nothing built).

    head_ops: names of the ops that run once per batch, in order (the head run).
    cut: tensors the head computes and the body reads (the head's run fetches them, the lane's run feeds them).
    head_targets: head ops the put waits for through a control edge only (run, through a NoOp that
        waits for them, by the head).
    """

    head_ops: frozenset[str]
    cut: tuple[tf.Tensor, ...]
    head_targets: tuple[tf.Operation, ...]


def _is_handle_op(op: tf.Operation) -> bool:
    if op.type in HANDLE_OPS:
        return True
    return (not op.inputs and bool(op.outputs)
            and all(t.dtype == tf.resource for t in op.outputs) and not op.type.startswith("Anonymous"))


def _stateful(op: tf.Operation) -> bool | None:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):  # an op without a registered OpDef
        return None


def _crossable(tensor: tf.Tensor) -> bool:
    """Whether the head can hand `tensor` to the body (fetch it as a value, then feed it)."""
    graph = tensor.graph
    return (tensor.dtype.base_dtype.as_datatype_enum not in UNFEEDABLE_DTYPES and graph.is_fetchable(tensor.op)
            and graph.is_feedable(tensor))


def _ancestors(ops: list[tf.Operation]) -> set[tf.Operation]:
    seen: set[tf.Operation] = set()
    todo = list(ops)
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def _joins(op: tf.Operation, head: set[tf.Operation]) -> bool:
    """Control-tied to the head, or fed a head tensor that cannot cross to the body."""
    return any(c in head for c in op.control_inputs) or any(t.op in head and not _crossable(t) for t in op.inputs)


def split_prefetch_side(put: tf.Operation) -> PrefetchSplit:
    """Splits the prefetch side of `put` (a QueueEnqueueV2) into its head and its body.

        before:  GetNext -> decode -> hash -> put
        after:   head {GetNext}, cut [GetNext:0], body {decode, hash}
    """
    side = _ancestors([put]) - {put}
    seeds = {op for op in side if LANES.is_head_op(op.type, _stateful(op), is_handle=_is_handle_op(op))}
    # upstream of the head, but the handles it reads: every lane shares them in this process
    head = close_head(side, seeds, lambda ops: {a for a in _ancestors(list(ops)) if not _is_handle_op(a)}, _joins)
    cut: dict[str, tf.Tensor] = {}
    for op in list(side - head) + [put]:
        for tensor in op.inputs:
            if tensor.op in head:
                cut.setdefault(tensor.name, tensor)
    targets = tuple(c for c in put.control_inputs if c in head)
    return PrefetchSplit(frozenset(op.name for op in head), tuple(cut.values()), targets)


__all__ = ["PrefetchSplit", "split_prefetch_side"]
