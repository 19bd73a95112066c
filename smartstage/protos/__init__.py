"""SmartStage's own protocol buffer messages (sources in this folder, see stage.proto)."""

from smartstage.protos.stage_pb2 import FeedDef, StageDef

__all__ = ["FeedDef", "StageDef"]
