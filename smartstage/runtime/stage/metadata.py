"""Stage descriptions kept in the graph itself, so they survive export, import and rewrites.

Every `staged()` call writes one `StageDef` into the graph collection `smartstage_stages`. The
collection holds small `StageRecord` objects; `register_proto_function` tells TensorFlow how to
write them into a MetaGraphDef (a `bytes_list` of serialized StageDefs, the way QueueRunnerDefs are
kept) and how to read them back, honouring `export_scope` / `import_scope` like `QueueRunner` does.

    before:  graph with a stage, then export_meta_graph / import_meta_graph into a new graph
    after:   stage_defs(new_graph) == stage_defs(old_graph)   # names prefixed by any import_scope
"""

from __future__ import annotations

import tensorflow as tf
from google.protobuf import message as protobuf_message
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import ops

from smartstage.errors import ConfigError
from smartstage.protos import STAGES_COLLECTION, TARGETS_COLLECTION  # noqa: F401 (the runtime's name for it)
from smartstage.protos.stage_pb2 import StageDef

# The StageDef fields that hold node or tensor names; export/import scopes apply to all of them.
_NAME_FIELDS = (
    "name",
    "buffer_node",
    "put_node",
    "take_node",
    "close_node",
    "cancel_node",
    "size_node",
    "ready_buffer_node",
    "ready_put_node",
    "stale_mark_node",
    "reset_node",
)
_REPEATED_NAME_FIELDS = ("boundary_tensors", "source_nodes", "reset_trigger_nodes")


def _rescope(stage_def: StageDef, rename) -> StageDef:
    """A copy of `stage_def` with `rename` applied to every node and tensor name it holds."""
    result = StageDef()
    result.CopyFrom(stage_def)
    for field in _NAME_FIELDS:
        value = getattr(result, field)
        if value:
            setattr(result, field, rename(value))
    for field in _REPEATED_NAME_FIELDS:
        values = getattr(result, field)
        values[:] = [rename(t) for t in values]
    for feed in result.feeds:
        feed.placeholder = rename(feed.placeholder)
        feed.tensor = rename(feed.tensor)
    return result


class StageRecord:
    """What the `smartstage_stages` collection holds: one StageDef, exportable like a QueueRunner.

        record = StageRecord(stage_def)
        record.to_proto(export_scope="tower0")   # names with "tower0/" stripped, or None if outside
    """

    def __init__(self, stage_def: StageDef):
        self.stage_def = stage_def

    @property
    def name(self) -> str:
        # export_meta_graph filters collection items by `.name` against the export scope.
        return self.stage_def.name

    def to_proto(self, export_scope: str | None = None) -> StageDef | None:
        """The StageDef with `export_scope` stripped, or None when the stage lies outside that scope."""
        if export_scope and not self.stage_def.name.startswith(export_scope):
            return None
        if not export_scope:
            return _rescope(self.stage_def, lambda n: n)
        return _rescope(self.stage_def, lambda n: ops.strip_name_scope(n, export_scope))

    @staticmethod
    def from_proto(stage_def: StageDef, import_scope: str | None = None) -> "StageRecord":
        """A record for `stage_def` with `import_scope` prepended to every name."""
        if not import_scope:
            return StageRecord(_rescope(stage_def, lambda n: n))
        return StageRecord(_rescope(stage_def, lambda n: ops.prepend_name_scope(n, import_scope)))

    def __repr__(self) -> str:
        return f"StageRecord({self.stage_def.name!r})"


ops.register_proto_function(
    STAGES_COLLECTION,
    proto_type=StageDef,
    to_proto=StageRecord.to_proto,
    from_proto=StageRecord.from_proto,
)


def _as_stage_def(item) -> StageDef:
    if isinstance(item, StageRecord):
        return item.stage_def
    if isinstance(item, StageDef):
        return item
    if isinstance(item, (bytes, str)):
        # A MetaGraphDef imported before smartstage was: TensorFlow keeps the raw bytes.
        return StageDef.FromString(item.encode("latin-1") if isinstance(item, str) else item)
    raise ConfigError(
        f"the graph collection {STAGES_COLLECTION!r} holds a {type(item).__name__}; it may only hold "
        "stage descriptions written by smartstage.staged() or the optimizer"
    )


def add_stage_def(graph: tf.Graph, stage_def: StageDef) -> None:
    """Records `stage_def` in `graph` (collection `smartstage_stages`).

        before:  stage_defs(graph) == []
        after:   stage_defs(graph) == [stage_def]
    """
    graph.add_to_collection(STAGES_COLLECTION, StageRecord(stage_def))


def stage_defs(graph: tf.Graph) -> list[StageDef]:
    """The descriptions of every stage in `graph`, in the order they were created.

        before:  x = ss.staged(batch, capacity=4)
        after:   stage_defs(tf.compat.v1.get_default_graph())[0].capacity == 4
    """
    return [_as_stage_def(item) for item in graph.get_collection(STAGES_COLLECTION)]


def stage_defs_from_meta_graph(meta_graph_def: meta_graph_pb2.MetaGraphDef) -> list[StageDef]:
    """The descriptions of every stage recorded in a MetaGraphDef, without importing it.

        before:  meta = tf.compat.v1.train.export_meta_graph()
        after:   [s.name for s in stage_defs_from_meta_graph(meta)] == ["stage"]
    """
    if STAGES_COLLECTION not in meta_graph_def.collection_def:
        return []
    collection = meta_graph_def.collection_def[STAGES_COLLECTION]
    try:
        return [StageDef.FromString(value) for value in collection.bytes_list.value]
    except protobuf_message.DecodeError as error:
        raise ConfigError(
            f"the MetaGraphDef collection {STAGES_COLLECTION!r} does not hold serialized StageDefs "
            f"({error}); it was written by something other than smartstage"
        ) from error
