"""GraphView: a thin, read-only index over a GraphDef.

This module is the one place that parses tensor names ("node", "node:port", "^control").

    view = GraphView(graph_def)
    view.data_inputs("loss")      # [TensorName(node='lookup', port=0), ...]
    view.fanouts("take")          # [Fanout(consumer='hash', index=0, port=1), ...]

The view never edits the GraphDef; passes build a new one (see smartstage.rewrite).
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple

from tensorflow.core.framework import graph_pb2, node_def_pb2, op_def_pb2, types_pb2

from smartstage.errors import GraphError

CONTROL_PORT = -1
_NEXT_ITERATION_OPS = ("NextIteration", "RefNextIteration")
_MERGE_OPS = ("Merge", "RefMerge")


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
    if name[0] == "^":
        return TensorName(name[1:], CONTROL_PORT)
    node, sep, port = name.rpartition(":")
    if sep and port.isdigit():
        return TensorName(node, int(port))
    return TensorName(name, 0)


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


@functools.lru_cache(maxsize=None)
def op_def(op_type: str) -> op_def_pb2.OpDef | None:
    """The registered OpDef of an op type, or None for op types this TensorFlow does not know."""
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


# Attributes that unknown op types (DeepRec's TensorBuffer*, custom kernels) commonly use for their output types.
_FALLBACK_TYPE_LIST_ATTRS = ("dtypes", "component_types", "Toutput_types", "output_types", "Tout")
_FALLBACK_TYPE_ATTRS = ("dtype", "T", "out_type", "DstT")


def output_dtypes(node: node_def_pb2.NodeDef) -> list[int] | None:
    """The DataType of every output of `node`, or None when it cannot be known.

    Known op types use their OpDef; unknown ones fall back to common type attributes.
    Ref outputs (legacy variables) have the `_REF` type.
    """
    od = op_def(node.op)
    if od is None:
        for key in _FALLBACK_TYPE_LIST_ATTRS:
            if key in node.attr and node.attr[key].HasField("list"):
                return list(node.attr[key].list.type)
        for key in _FALLBACK_TYPE_ATTRS:
            if key in node.attr and node.attr[key].type:
                return [node.attr[key].type]
        return None
    result: list[int] = []
    for arg in od.output_arg:
        if arg.type_list_attr:
            if arg.type_list_attr not in node.attr:
                return None
            types = list(node.attr[arg.type_list_attr].list.type)
        else:
            if arg.type:
                dtype = arg.type
            elif arg.type_attr in node.attr:
                dtype = node.attr[arg.type_attr].type
            else:
                default = next((a for a in od.attr if a.name == arg.type_attr), None)
                if default is None or not default.HasField("default_value"):
                    return None
                dtype = default.default_value.type
            count = 1
            if arg.number_attr:
                if arg.number_attr in node.attr:
                    count = node.attr[arg.number_attr].i
                else:
                    default = next((a for a in od.attr if a.name == arg.number_attr), None)
                    if default is None:
                        return None
                    count = default.default_value.i
            types = [dtype] * count
        if arg.is_ref:
            types = [t + 100 if t < 100 else t for t in types]
        result.extend(types)
    return result


def is_stateful_op(op_type: str) -> bool | None:
    """Whether TensorFlow registers `op_type` as stateful; None for unknown op types."""
    od = op_def(op_type)
    return None if od is None else od.is_stateful


def dtype_name(dtype: int) -> str:
    return types_pb2.DataType.Name(dtype)[3:].lower() if dtype in types_pb2.DataType.values() else str(dtype)


@dataclass
class _Entry:
    node: node_def_pb2.NodeDef
    inputs: list[TensorName]


class GraphView:
    """Read-only index of a GraphDef: nodes by name, inputs parsed once, fanouts with ports.

    Raises GraphError for duplicate node names; missing inputs are reported by `check_inputs()`.
    """

    def __init__(self, graph_def: graph_pb2.GraphDef):
        self.graph_def = graph_def
        self._entries: dict[str, _Entry] = {}
        for node in graph_def.node:
            if not node.name:
                raise GraphError(f"a node of op type {node.op!r} has an empty name; every NodeDef needs a unique name")
            if node.name in self._entries:
                raise GraphError(
                    f"duplicate node name {node.name!r} (op types {self._entries[node.name].node.op} and {node.op}); "
                    "node names must be unique: rename one of them"
                )
            self._entries[node.name] = _Entry(node, [parse_tensor_name(s) for s in node.input])
        self._fanouts: dict[str, list[Fanout]] | None = None

    # -- nodes -------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> Iterator[str]:
        return iter(self._entries)

    def node(self, name: str) -> node_def_pb2.NodeDef:
        try:
            return self._entries[name].node
        except KeyError:
            raise GraphError(f"the graph has no node named {name!r}") from None

    def op(self, name: str) -> str:
        return self.node(name).op

    # -- edges -------------------------------------------------------------------------------
    def inputs(self, name: str) -> list[TensorName]:
        """All inputs of `name` in NodeDef order: data inputs, then control inputs."""
        try:
            return self._entries[name].inputs
        except KeyError:
            raise GraphError(f"the graph has no node named {name!r}") from None

    def data_inputs(self, name: str) -> list[TensorName]:
        return [t for t in self.inputs(name) if t.port != CONTROL_PORT]

    def control_inputs(self, name: str) -> list[str]:
        return [t.node for t in self.inputs(name) if t.port == CONTROL_PORT]

    def input_nodes(self, name: str) -> set[str]:
        return {t.node for t in self.inputs(name)}

    def fanouts(self, name: str) -> list[Fanout]:
        """Every use of `name`'s outputs and of `name` as a control input, in graph order."""
        if self._fanouts is None:
            fanouts: dict[str, list[Fanout]] = {n: [] for n in self._entries}
            for consumer, entry in self._entries.items():
                for index, (src, port) in enumerate(entry.inputs):
                    bucket = fanouts.get(src)
                    if bucket is not None:
                        bucket.append(Fanout(consumer, index, port))
            self._fanouts = fanouts
        return self._fanouts.get(name, [])

    def consumers(self, name: str) -> list[str]:
        """Distinct consumers of `name` (data or control), in graph order."""
        seen: dict[str, None] = {}
        for f in self.fanouts(name):
            seen.setdefault(f.consumer, None)
        return list(seen)

    # -- checks and orders -------------------------------------------------------------------
    def missing_inputs(self) -> list[tuple[str, str]]:
        """(node, input) pairs whose input names no node of the graph."""
        entries = self._entries
        return [
            (name, str(t)) for name, e in entries.items() for t in e.inputs if t.node not in entries
        ]

    def check_inputs(self) -> None:
        missing = self.missing_inputs()
        if missing:
            node, inp = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise GraphError(
                f"node {node!r} reads {inp!r}, but the graph has no node {parse_tensor_name(inp).node!r}{more}; "
                "export the whole graph, or remove the dangling input"
            )

    def topological_order(self) -> list[str]:
        """Nodes ordered so that every node comes after all its inputs; GraphError names a cycle."""
        entries = self._entries
        indegree = {name: 0 for name in entries}
        for name, e in entries.items():
            indegree[name] = len({t.node for t in e.inputs if t.node in entries and not self._is_back_edge(t.node, name)})
        ready = deque(name for name, d in indegree.items() if d == 0)
        order: list[str] = []
        while ready:
            name = ready.popleft()
            order.append(name)
            seen: set[str] = set()
            for f in self.fanouts(name):
                if f.consumer in seen or self._is_back_edge(name, f.consumer):
                    continue
                seen.add(f.consumer)
                indegree[f.consumer] -= 1
                if indegree[f.consumer] == 0:
                    ready.append(f.consumer)
        if len(order) != len(entries):
            raise GraphError(f"the graph has a cycle: {' -> '.join(self._find_cycle(indegree))}; "
                             "a GraphDef must be acyclic (only the NextIteration -> Merge back edges of "
                             "tf.while_loop may close a loop)")
        return order

    def _is_back_edge(self, src: str, dst: str) -> bool:
        """A v1 while loop's NextIteration -> Merge edge: the one cycle TensorFlow allows."""
        return self._entries[src].node.op in _NEXT_ITERATION_OPS and self._entries[dst].node.op in _MERGE_OPS

    def _find_cycle(self, indegree: dict[str, int]) -> list[str]:
        # Walk backwards through unresolved nodes until one repeats: that walk closes a cycle.
        start = next(n for n, d in indegree.items() if d > 0)
        path: list[str] = []
        index: dict[str, int] = {}
        node = start
        while node not in index:
            index[node] = len(path)
            path.append(node)
            node = next(t.node for t in self.inputs(node)
                        if indegree.get(t.node, 0) > 0 and not self._is_back_edge(t.node, node))
        cycle = path[index[node]:] + [node]
        return list(reversed(cycle))

    def ancestors(self, roots: Iterable[str], stop: set[str] | None = None) -> set[str]:
        """Every node some root depends on (data or control), roots included; `stop` nodes are not entered."""
        stop = stop or set()
        seen: set[str] = set()
        todo = [r for r in roots if r not in stop]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for t in self.inputs(name):
                if t.node not in seen and t.node not in stop and t.node in self._entries:
                    todo.append(t.node)
        return seen

    # -- types -------------------------------------------------------------------------------
    def output_dtypes(self, name: str) -> list[int] | None:
        return output_dtypes(self.node(name))

    def dtype_of(self, tensor: TensorName) -> int | None:
        types = self.output_dtypes(tensor.node)
        if types is None or tensor.port >= len(types):
            return None
        return types[tensor.port]

    def output_shape(self, tensor: TensorName):
        """The `_output_shapes` entry of a tensor (a TensorShapeProto), or None."""
        node = self.node(tensor.node)
        if "_output_shapes" in node.attr:
            shapes = node.attr["_output_shapes"].list.shape
            if tensor.port < len(shapes):
                return shapes[tensor.port]
        return None
