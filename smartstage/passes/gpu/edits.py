"""The edits of one gpu_placement run: collected while planning, applied to a copy of the GraphDef at once.

    edits = PlacementEdits(view)
    edits.set_device("hash", "/device:CPU:0"); edits.set_attr("stage/put", "_input_hostmem", value)
    new_def = edits.apply(graph_def)   # the only place the pass writes NodeDefs; never called: nothing changes

device_of() answers with the device planned so far, so later decisions see earlier ones.
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from smartstage.graph.view import GraphView
from smartstage.passes.gpu.devices import same_device


class PlacementEdits:
    """The changes to apply, collected first, applied all at once (or not at all)."""

    def __init__(self, view: GraphView):
        self.view = view
        self.device: dict[str, str] = {}
        self.attrs: dict[str, dict[str, attr_value_pb2.AttrValue | None]] = {}
        self.inputs: dict[str, list[str]] = {}
        self.new_nodes: list[node_def_pb2.NodeDef] = []
        self._new_names: set[str] = set()

    def device_of(self, name: str) -> str:
        if name in self.device:
            return self.device[name]
        return self.view.node(name).device if name in self.view else ""

    def set_device(self, name: str, device: str) -> bool:
        if same_device(self.device_of(name), device) and self.device_of(name):
            return False
        self.device[name] = device
        return True

    def set_attr(self, name: str, key: str, value: attr_value_pb2.AttrValue | None) -> bool:
        node = self.view.node(name)
        current = node.attr[key] if key in node.attr else None
        if current == value:
            return False
        self.attrs.setdefault(name, {})[key] = value
        return True

    def unique_name(self, wanted: str) -> str:
        name, i = wanted, 1
        while name in self.view or name in self._new_names:
            name, i = f"{wanted}_{i}", i + 1
        self._new_names.add(name)
        return name

    @property
    def empty(self) -> bool:
        return not (self.device or self.attrs or self.inputs or self.new_nodes)

    def apply(self, graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
        new = graph_pb2.GraphDef()
        new.CopyFrom(graph_def)
        for node in new.node:
            if node.name in self.device:
                node.device = self.device[node.name]
            for key, value in self.attrs.get(node.name, {}).items():
                if value is None:
                    del node.attr[key]
                else:
                    node.attr[key].CopyFrom(value)
            if node.name in self.inputs:
                del node.input[:]
                node.input.extend(self.inputs[node.name])
        new.node.extend(self.new_nodes)
        return new


__all__ = ["PlacementEdits"]
