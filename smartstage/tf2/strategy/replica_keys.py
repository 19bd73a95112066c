"""replica_keys: structural keys that name one op the same way in a GraphDef and in a graph being traced.

    reference GraphDef:  x -> StringToHashBucketFast(8) -> lookup(table) -> y    key(lookup) = digest(LookupTableFindV2,
    a later trace:       x' -> StringToHashBucketFast(8) -> lookup(table) -> y'     attrs, key(hash), table, -1)

A key is a digest of what decides an op's value: its type, its attributes (not its name, device or private
`_` attributes) and its inputs' keys; an input of the step is its position, a constant is its value, a
captured resource is the resource (the same table in every replica) and a captured value is its contents.
Two ops with one key compute one value from the same batch, so a value computed for one stands for the
other (smartstage.tf2.strategy.replica_step).
"""

from __future__ import annotations

import hashlib
from typing import Any

import tensorflow as tf

from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView

# A key is a digest of what it stands for (its op's type, attributes and input keys): fixed in size, so
# comparing and hashing keys of a deep graph costs the same as of a shallow one.
Key = bytes


def _digest(*parts: bytes) -> Key:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


def input_key(index: int) -> Key:
    """The key of the step's flat input `index`."""
    return _digest(b"input", str(index).encode())


def tensor_key(op_key: Key, port: int) -> Key:
    """The key of output `port` of the op keyed `op_key`."""
    return _digest(b"output", op_key, str(port).encode())


def _attributes(node_def) -> list[bytes]:
    """The attributes that decide what an op computes (names, devices and private `_` attributes do not)."""
    return [k.encode() + b"=" + v.SerializeToString(deterministic=True) for k, v in sorted(node_def.attr.items())
            if not k.startswith("_")]


def reference_keys(view: GraphView, received: dict[str, int], captures: dict[str, int],
                   nodes: set[str]) -> dict[str, Key]:
    """{node: key} for `nodes` of the reference graph and their ancestors; `received` names the tensors the
    step got ({tensor: flat input index}), `captures` the captured placeholders ({node: capture_key})."""
    keys: dict[str, Key] = {}

    def key_of_tensor(tensor: str) -> Key:
        t = parse_tensor_name(tensor)
        if str(t) in received:
            return input_key(received[str(t)])
        node_key = key_of(t.node)
        return None if node_key is None else tensor_key(node_key, t.port)

    def key_of(name: str) -> Key:
        if name in keys:
            return keys[name]
        keys[name] = None  # a cycle (loop) keys to None
        if name in captures:
            keys[name] = captures[name]
            return keys[name]
        node = view.node(name)
        if node.op == "Placeholder":
            return None
        inputs = tuple(key_of_tensor(s) for s in node.input if not s.startswith("^"))
        keys[name] = None if any(k is None for k in inputs) else _op_key(node, inputs)
        return keys[name]

    for name in sorted(nodes):
        key_of(name)
    return keys


def _value_key(array) -> Key:
    contents = array.tobytes() if array.dtype != object else repr(array.ravel().tolist()).encode()
    return _digest(b"value", array.dtype.str.encode(), repr(tuple(array.shape)).encode(), contents)


def _op_key(node_def, inputs: tuple) -> Key:
    """An op's key from its NodeDef and its inputs' keys; a constant is keyed by its value, as a captured
    value is (a trace inlines a small captured tensor as a Const)."""
    if node_def.op == "Const":
        return _value_key(tf.make_ndarray(node_def.attr["value"].tensor))
    return _digest(b"op", node_def.op.encode(), *_attributes(node_def), b"inputs", *inputs)


def capture_key(external) -> Key:
    """A captured value's key: a resource by identity (the same table in every replica), a value by its
    contents (a trace may capture a fresh copy of a constant)."""
    if getattr(external, "dtype", None) == tf.resource or not hasattr(external, "numpy"):
        return _digest(b"resource", str(id(external)).encode())
    return _value_key(external.numpy())


def _external(tensor) -> Any:
    """The value a captured placeholder stands for, through nested function graphs; None if not a capture."""
    graph = tensor.graph
    while hasattr(graph, "captures"):
        found = next((ext for ext, internal in graph.captures if internal is tensor), None)
        if found is None:
            return None
        if not hasattr(found, "graph") or not hasattr(found.graph, "captures"):
            return found  # an eager tensor (a resource handle or a captured value)
        tensor, graph = found, found.graph
    return tensor


class LiveKeys:
    """Keys of the tensors of a graph being traced, as reference_keys gives them for a GraphDef: `known`
    ({tensor ref: key}) names the inputs; every other tensor is keyed from its op when first asked, so a key
    never depends on which ops a callback was shown."""

    def __init__(self, known: dict):
        self.keyed = known  # {tensor ref: key}: the inputs, then every tensor keyed so far

    def _own_key(self, tensor, inputs: tuple) -> Key:
        op = tensor.op
        if op.type == "Placeholder":
            external = _external(tensor)
            # as the reference keys a captured placeholder's output
            return None if external is None else tensor_key(capture_key(external), 0)
        if any(k is None for k in inputs):
            return None
        return tensor_key(_op_key(op.node_def, inputs), tensor.value_index)

    def key(self, tensor) -> Key:
        """The tensor's structural key (None when it reads something the reference cannot name)."""
        stack = [tensor]
        while stack:
            top = stack[-1]
            if top.ref() in self.keyed:
                stack.pop()
                continue
            pending = [] if top.op.type in ("Placeholder", "Const") else [
                t for t in top.op.inputs if t.ref() not in self.keyed]
            if pending:
                stack.extend(pending)
                continue
            inputs = () if top.op.type in ("Placeholder", "Const") else tuple(
                self.keyed[t.ref()] for t in top.op.inputs)
            self.keyed[top.ref()] = self._own_key(top, inputs)
            stack.pop()
        return self.keyed[tensor.ref()]

    def op_key(self, op) -> Key:
        """The op's key, as reference_keys gives its node."""
        inputs = tuple(self.key(t) for t in op.inputs)
        return None if any(k is None for k in inputs) else _op_key(op.node_def, inputs)


__all__ = ["Key", "LiveKeys", "capture_key", "input_key", "reference_keys", "tensor_key"]
