"""Tensor names: the one place that parses "node", "node:port" and "^control".

    parse_tensor_name("emb/lookup:1")   # TensorName(node='emb/lookup', port=1)
    input_string("emb/lookup", 0)       # "emb/lookup": port 0 is written bare, as TensorFlow does
"""

from __future__ import annotations

from typing import NamedTuple


from smartstage.errors import GraphError


CONTROL_PORT = -1


class TensorName(NamedTuple):
    """A parsed input string: `node:port`, or `^node` (port == CONTROL_PORT)."""

    node: str
    port: int

    @property
    def is_control(self) -> bool:
        return self.port == CONTROL_PORT

    def __str__(self) -> str:
        return tensor_name(self.node, self.port)


def parse_tensor_name(name: str) -> TensorName:
    """Parses "node", "node:3" or "^node" into a TensorName.

    >>> parse_tensor_name("emb/lookup:1")
    TensorName(node='emb/lookup', port=1)
    >>> parse_tensor_name("^init").is_control
    True
    """
    if not name:
        raise GraphError("an empty tensor name; expected 'node', 'node:port' or '^node'")
    return parse_input(name)


def tensor_name(node: str, port: int) -> str:
    """The canonical name of an output: "node:port", or "^node" for a control edge."""
    return "^" + node if port == CONTROL_PORT else f"{node}:{port}"


def input_string(node: str, port: int) -> str:
    """How a NodeDef input refers to an output: port 0 is written bare, as TensorFlow does."""
    if port == CONTROL_PORT:
        return "^" + node
    return node if port == 0 else f"{node}:{port}"


class Fanout(NamedTuple):
    """One use of a node: `consumer`'s input number `index` reads output `port` (CONTROL_PORT: a control edge)."""

    consumer: str
    index: int
    port: int


new_tuple = tuple.__new__  # builds NamedTuples without their Python-level constructor: graphs have 10^6 edges


def parse_input(s: str) -> TensorName:
    if s[0] == "^":
        return new_tuple(TensorName, (s[1:], CONTROL_PORT))
    if ":" in s:
        node, _, port = s.rpartition(":")
        if port.isdigit():
            return new_tuple(TensorName, (node, int(port)))
    return new_tuple(TensorName, (s, 0))


def input_source(s: str) -> str:
    """The node an input string reads from: "x:1" -> "x", "^x" -> "x", "x" -> "x"."""
    if s[0] == "^":
        return s[1:]
    return s.rpartition(":")[0] if ":" in s and s.rpartition(":")[2].isdigit() else s
