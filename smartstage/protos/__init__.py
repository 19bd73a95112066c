"""SmartStage's own protocol buffer messages (sources in this folder, see stage.proto)."""

from smartstage.protos.stage_pb2 import FeedDef, StageDef

# Graph collections SmartStage keeps in the graph itself (so they survive export_meta_graph):
STAGES_COLLECTION = "smartstage_stages"  # bytes_list of serialized StageDefs
TARGETS_COLLECTION = "smartstage_targets"  # node_list of ops the optimizer keeps on the main side

__all__ = ["FeedDef", "StageDef", "STAGES_COLLECTION", "TARGETS_COLLECTION"]
