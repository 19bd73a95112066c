"""SmartStage's own protocol buffer messages (sources in this folder, see stage.proto)."""

from smartstage.protos.stage_pb2 import FeedDef, StageDef

# Graph collections SmartStage keeps in the graph itself (so they survive export_meta_graph):
STAGES_COLLECTION = "smartstage_stages"  # bytes_list of serialized StageDefs
TARGETS_COLLECTION = "smartstage_targets"  # node_list of ops the optimizer keeps on the main side

# A StageDef's num_threads, capacity or stage_subgraph_thread_pool_id of -1: "the runtime chooses" (like
# tf.data.AUTOTUNE). Defined here, beside StageDef, so config, graph, the passes and the runtime share one
# name; the runtime re-exports it as smartstage.AUTOTUNE and resolves it once (runtime/stage/settings.py).
AUTOTUNE = -1

__all__ = ["AUTOTUNE", "FeedDef", "StageDef", "STAGES_COLLECTION", "TARGETS_COLLECTION"]
