"""Fetches and feeds of a rewritten graph: the same batch as the step, or a clear error.

    before:  sess.run([train_op, features["label"], hashed])     # names the user holds
    after:   sess.run([train_op, take':3, take':5])              # the new take outputs carrying them

After SmartStage moved `hashed` to the prefetch side, running it from the main side would pull
another batch through the input. A fetch of a tensor that crosses the stage is served by the new
take output that carries it (the batch being trained on); a fetch of anything else on the prefetch
side, or a feed of it, raises TargetError naming the node and the fix (mark it as a target).
Structures are kept: lists, tuples, namedtuples, dicts, SparseTensors, IndexedSlices, names.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from smartstage.errors import TargetError
from smartstage.session.record import LiveRewrite


def _mark_hint(node: str) -> str:
    return (f"mark it as a target before the session is created (smartstage.mark_target_node([...]) on "
            f"'{node}', or DeepRec's tf.train.mark_target_node) so it stays on the main side")


class FetchMapper:
    """Maps fetches of a rewritten graph to what carries them, and refuses feeds of moved tensors."""

    def __init__(self, record: LiveRewrite | None):
        self.record = record
        self.active = bool(record is not None and record.stages)

    # -- fetches --------------------------------------------------------------------------------

    def map_fetches(self, fetches: Any) -> Any:
        """`fetches` with every tensor or op now on a prefetch side replaced by what the step reads."""
        if not self.active:
            return fetches
        return self._map(fetches)

    def _map(self, item: Any) -> Any:
        if isinstance(item, tf.Tensor):
            return self._tensor(item)
        if isinstance(item, tf.Operation):
            return self._op(item)
        if isinstance(item, str):
            return self._name(item)
        if isinstance(item, (tf.SparseTensor, tf.IndexedSlices)):
            parts = item._type_spec._to_components(item)  # noqa: SLF001
            mapped = [self._map(p) for p in parts]
            if all(a is b for a, b in zip(parts, mapped)):
                return item
            return item._type_spec._from_components(mapped)  # noqa: SLF001
        if isinstance(item, dict):
            mapped = {k: self._map(v) for k, v in item.items()}
            if all(mapped[k] is v for k, v in item.items()):
                return item
            try:
                return type(item)(mapped)
            except TypeError:
                return mapped
        if isinstance(item, (list, tuple)):
            mapped = [self._map(v) for v in item]
            if all(a is b for a, b in zip(item, mapped)):
                return item
            if isinstance(item, tuple) and hasattr(item, "_fields"):
                return type(item)(*mapped)
            return type(item)(mapped)
        return item

    def _tensor(self, tensor: tf.Tensor) -> tf.Tensor:
        record = self.record
        mapped = record.tensor_map.get(tensor.name)
        if mapped is not None:
            return mapped
        if tensor.op.name in record.prefetch_nodes or tensor.op.name in record.unservable:
            raise self._fetch_error(tensor.name, tensor.op.name)
        return tensor

    def _op(self, op: tf.Operation) -> tf.Operation:
        record = self.record
        mapped = record.op_map.get(op.name)
        if mapped is not None:
            return mapped
        if op.name in record.prefetch_nodes or op.name in record.unservable:
            raise self._fetch_error(op.name, op.name)
        return op

    def _name(self, name: str) -> str:
        record = self.record
        if ":" in name:
            mapped = record.tensor_map.get(name)
            if mapped is not None:
                return mapped.name
            node = name.rsplit(":", 1)[0]
        else:
            mapped_op = record.op_map.get(name)
            if mapped_op is not None:
                return mapped_op.name
            node = name
        if node in record.prefetch_nodes or node in record.unservable:
            raise self._fetch_error(name, node)
        return name

    def _fetch_error(self, fetch: str, node: str) -> TargetError:
        if node in self.record.unservable:
            return TargetError(f"cannot fetch {fetch!r}: {self.record.unservable[node]}")
        stage = self.record.prefetch_nodes[node]
        if any(s.old_ops.get("take") == node for s in self.record.stages):
            return TargetError(
                f"cannot fetch {fetch!r}: it is what staged() returned for stage '{stage}', and after SmartStage "
                "moved its readers to the prefetch side no main-side op reads it, so the new buffer does not "
                "carry it. Mark it before the session is created (smartstage.mark_target_node([tensor]), or "
                "targets=[tensor] of the session): it then crosses the stage, and the fetch gives the batch the "
                "step trains on"
            )
        return TargetError(
            f"cannot fetch {fetch!r}: SmartStage moved node '{node}' to the prefetch side of stage '{stage}' and "
            "its value does not cross the stage, so the training step no longer computes it (running it now "
            f"would read another batch than the one trained on); {_mark_hint(node)}"
        )

    # -- feeds ----------------------------------------------------------------------------------

    def check_feeds(self, feed_dict: Any) -> None:
        """TargetError for a feed of a tensor that now runs on a prefetch side (the step would ignore it)."""
        if not self.active or not feed_dict:
            return
        for key in feed_dict:
            for tensor in _feed_names(key):
                node = tensor.rsplit(":", 1)[0]
                if node in self.record.prefetch_nodes:
                    stage = self.record.prefetch_nodes[node]
                    raise TargetError(
                        f"cannot feed {tensor!r}: SmartStage moved node '{node}' to the prefetch side of stage "
                        f"'{stage}'; the training step reads its value from the stage, so a fed value would be "
                        f"ignored. Feed a placeholder (placeholders stay on the main side), or {_mark_hint(node)}"
                    )


def _feed_names(key: Any) -> list[str]:
    if isinstance(key, str):
        return [key if ":" in key else key + ":0"]
    if isinstance(key, tf.Tensor):
        return [key.name]
    if isinstance(key, (tf.SparseTensor, tf.IndexedSlices)):
        return [t.name for t in key._type_spec._to_components(key) if isinstance(t, tf.Tensor)]  # noqa: SLF001
    if isinstance(key, (list, tuple)):
        return [n for k in key for n in _feed_names(k)]
    name = getattr(key, "name", None)
    return [name] if isinstance(name, str) else []
