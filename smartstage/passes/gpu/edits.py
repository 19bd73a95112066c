"""The edit log of one gpu_placement run: smartstage.graph.edits.EditLog, with devices compared as placements.

    edits = PlacementEdits(view)
    edits.set_device("hash", "/device:CPU:0"); edits.set_attr("stage/put", "_input_hostmem", value)
    new_def = apply_to_graph_def(graph_def, edits.edits, view)   # nothing recorded: nothing changes

device_of() answers with the device planned so far, so later decisions see earlier ones. A device
that names the same place as the planned one ("/cpu:0" and "/device:CPU:0") is not recorded again,
nor an attribute equal to the graph's.
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2

from smartstage.graph.edits import EditLog
from smartstage.passes.gpu.devices import same_device


class PlacementEdits(EditLog):
    """The placement's edits, collected first, applied all at once (or not at all)."""

    def set_device(self, name: str, device: str) -> bool:  # type: ignore[override]
        current = self.device_of(name)
        if current and same_device(current, device):
            return False
        super().set_device(name, device)
        return True

    def set_attr(self, name: str, key: str, value: attr_value_pb2.AttrValue | None) -> bool:  # type: ignore[override]
        node = self.view.node(name)
        current = node.attr[key] if key in node.attr else None
        if current == value:
            return False
        super().set_attr(name, key, value)
        return True


__all__ = ["PlacementEdits"]
