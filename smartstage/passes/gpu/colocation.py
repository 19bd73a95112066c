"""Colocation groups: the nodes stock TensorFlow's placer keeps on one device, whatever their device strings.

    groups = ColocationGroups(view)
    groups.group("q")   # ("put", "q", "take", ...): `_class` loc:@ links and resource/ref edges, transitively

Reads the GraphDef and the OpDef registry; nothing edits a graph.
"""

from __future__ import annotations

from tensorflow.core.framework import node_def_pb2, types_pb2

from smartstage.graph.view import GraphView
from smartstage.graph.op_types import FUNCTIONAL_OPS, is_ref_dtype, op_def
from smartstage.passes.gpu.kernels import attr_or_default

# Ops whose resource inputs the placer does not colocate with the resource (functions run anywhere).
# Functional control flow and calls are exempt from colocation: the placer places their bodies.
_COLOCATION_EXEMPT_OPS = frozenset(FUNCTIONAL_OPS)
_COLOCATION_ATTR = "_class"
_COLOCATION_PREFIX = b"loc:@"


class ColocationGroups:
    """The groups of nodes stock TensorFlow's placer puts on one device.

    Two nodes are in one group when one names the other in its `_class` attribute (`loc:@name`, what
    tf.colocate_with writes) or when one reads a resource or ref output of the other (a queue or table
    handle and its users, a variable and its reads; the placer colocates those edges), transitively.
    Groups are found on demand, so asking about the prefetch side costs what the prefetch side is worth.
    """

    def __init__(self, view: GraphView):
        self.view = view
        self._class_links: dict[str, set[str]] = {}
        for node in view.graph_def.node:
            if _COLOCATION_ATTR in node.attr:
                for loc in node.attr[_COLOCATION_ATTR].list.s:
                    if loc.startswith(_COLOCATION_PREFIX):
                        other = loc[len(_COLOCATION_PREFIX):].decode()
                        if other in view and other != node.name:
                            self._class_links.setdefault(node.name, set()).add(other)
                            self._class_links.setdefault(other, set()).add(node.name)
        self._handles: dict[str, frozenset[int]] = {}
        self._groups: dict[str, tuple[str, ...]] = {}

    def _handle_ports_of(self, name: str) -> frozenset[int]:
        if name not in self._handles:
            self._handles[name] = _handle_ports(self.view, name) if name in self.view else frozenset()
        return self._handles[name]

    def _neighbours(self, name: str):
        view = self.view
        yield from self._class_links.get(name, ())
        exempt = view.op(name) in _COLOCATION_EXEMPT_OPS
        if not exempt:
            for t in view.data_inputs(name):
                if t.port in self._handle_ports_of(t.node):
                    yield t.node
        handles = self._handle_ports_of(name)
        if handles:
            for f in view.fanouts(name):
                if f.port in handles and view.op(f.consumer) not in _COLOCATION_EXEMPT_OPS:
                    yield f.consumer

    def group(self, name: str) -> tuple[str, ...]:
        """Every node colocated with `name`, `name` included, in a stable order."""
        found = self._groups.get(name)
        if found is not None:
            return found
        seen = {name}
        todo = [name]
        while todo:
            for other in self._neighbours(todo.pop()):
                if other not in seen and other in self.view:
                    seen.add(other)
                    todo.append(other)
        group = tuple(sorted(seen))
        for member in group:
            self._groups[member] = group
        return group


def _handle_ports(view: GraphView, name: str) -> frozenset[int]:
    """The outputs of `name` that are resource handles or refs (legacy variables, v1 queues)."""
    node = view.node(name)
    if not _may_output_handle(node):
        return frozenset()
    types = view.output_dtypes(name) or []
    return frozenset(i for i, d in enumerate(types) if d in _HANDLE_TYPES or is_ref_dtype(d))


_HANDLE_TYPES = frozenset({types_pb2.DT_RESOURCE, types_pb2.DT_RESOURCE_REF})


def _may_output_handle(node: node_def_pb2.NodeDef) -> bool:
    """A quick no for the common case: no output of the op can be a resource or a ref, given its type attrs."""
    od = op_def(node.op)
    if od is None:
        return True
    for arg in od.output_arg:
        if arg.is_ref or arg.type in _HANDLE_TYPES:
            return True
        if arg.type_attr:
            value = attr_or_default(node, arg.type_attr)
            if value is None or value.type in _HANDLE_TYPES:
                return True
        if arg.type_list_attr:
            value = attr_or_default(node, arg.type_list_attr)
            if value is None or any(t in _HANDLE_TYPES for t in value.list.type):
                return True
    return False


__all__ = ["ColocationGroups"]
