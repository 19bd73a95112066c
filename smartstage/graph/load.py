"""Loading graphs from every form optimize() accepts, and writing them back atomically.

    loaded = load_graph("model.meta")      # LoadedGraph(graph_def=..., meta_graph_def=..., source="model.meta")
    write_graph(result.graph_def, "out.pb") # same format as the extension says; no partial file on failure
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.errors import GraphError
from smartstage.graph.eager import reject_eager_input
from smartstage.graph.names import parse_tensor_name
from smartstage.protos import STAGES_COLLECTION, TARGETS_COLLECTION, StageDef

# Collections whose members the training step fetches: they stay on the main side.
TARGET_COLLECTIONS = ("train_op", "losses", "summaries", "update_ops", TARGETS_COLLECTION)
FORMATS = (".pb", ".pbtxt", ".meta")


@dataclass
class LoadedGraph:
    graph_def: graph_pb2.GraphDef
    meta_graph_def: meta_graph_pb2.MetaGraphDef | None = None
    source: str = "GraphDef"
    borrowed: bool = False  # the caller's own message (load_graph(..., copy=False)): read it, never edit it


def load_graph(graph, copy: bool = True) -> LoadedGraph:
    """The graph in any accepted form: GraphDef, MetaGraphDef, tf.Graph, or a file path.

    A GraphDef or MetaGraphDef is copied, unless `copy=False`: then the result borrows the caller's
    message (`borrowed`), for a reader that never edits it (optimize() saves the copy of a large graph).
    """
    if isinstance(graph, graph_pb2.GraphDef):
        if not copy:
            return LoadedGraph(graph, borrowed=True)
        private = graph_pb2.GraphDef()
        private.CopyFrom(graph)
        return LoadedGraph(private)
    if isinstance(graph, meta_graph_pb2.MetaGraphDef):
        if not copy:
            return LoadedGraph(graph.graph_def, graph, "MetaGraphDef", borrowed=True)
        meta = meta_graph_pb2.MetaGraphDef()
        meta.CopyFrom(graph)
        return LoadedGraph(meta.graph_def, meta, "MetaGraphDef")
    if isinstance(graph, (str, os.PathLike)):
        return _load_file(Path(graph))
    if type(graph).__name__ in ("Graph", "FuncGraph") and hasattr(graph, "as_graph_def"):
        import tensorflow as tf

        meta = tf.compat.v1.train.export_meta_graph(graph=graph, graph_def=graph.as_graph_def(add_shapes=True))
        return LoadedGraph(meta.graph_def, meta, "tf.Graph")
    reject_eager_input(graph)  # a tf.function, Keras model, eager tensor: EagerModeError naming the TF2 entry point
    raise GraphError(f"cannot optimize a {type(graph).__name__}: pass a GraphDef, a MetaGraphDef, a tf.Graph, "
                     f"or the path of a {', '.join(FORMATS)} file")


def _load_file(path: Path) -> LoadedGraph:
    if not path.exists():
        raise GraphError(f"graph file {str(path)!r} does not exist")
    if path.suffix not in FORMATS:
        raise GraphError(f"graph file {str(path)!r}: unknown extension {path.suffix!r}; use one of {FORMATS} "
                         "(.pb: binary GraphDef, .pbtxt: text GraphDef or MetaGraphDef, .meta: binary MetaGraphDef)")
    data = path.read_bytes()
    if not data:
        raise GraphError(f"graph file {str(path)!r} is empty")
    try:
        if path.suffix == ".meta":
            meta = meta_graph_pb2.MetaGraphDef.FromString(data)
            if not meta.graph_def.node:
                raise GraphError(f"graph file {str(path)!r} holds a MetaGraphDef without nodes")
            return LoadedGraph(meta.graph_def, meta, str(path))
        if path.suffix == ".pb":
            graph_def = graph_pb2.GraphDef.FromString(data)
            if not graph_def.node:
                raise GraphError(f"graph file {str(path)!r} holds no GraphDef nodes (is it a GraphDef?)")
            return LoadedGraph(graph_def, None, str(path))
        text = data.decode("utf-8")
        if text.lstrip().startswith(("meta_info_def", "graph_def", "collection_def", "saver_def")):
            meta = text_format.Parse(text, meta_graph_pb2.MetaGraphDef())
            return LoadedGraph(meta.graph_def, meta, str(path))
        return LoadedGraph(text_format.Parse(text, graph_pb2.GraphDef()), None, str(path))
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
        kind = {".pb": "binary GraphDef", ".meta": "binary MetaGraphDef", ".pbtxt": "text GraphDef"}[path.suffix]
        raise GraphError(f"graph file {str(path)!r} is not a valid {kind} (truncated or another format?): {e}") from None


def graph_bytes(graph, path) -> bytes:
    """The bytes of a GraphDef or MetaGraphDef in the format of `path`'s extension (GraphError otherwise)."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise GraphError(f"cannot write {str(path)!r}: use one of the extensions {FORMATS}")
    if path.suffix == ".meta" and not isinstance(graph, meta_graph_pb2.MetaGraphDef):
        raise GraphError(f"cannot write {str(path)!r}: a .meta file needs a MetaGraphDef (optimize a .meta input)")
    if path.suffix == ".pb" and isinstance(graph, meta_graph_pb2.MetaGraphDef):
        graph = graph.graph_def
    return text_format.MessageToString(graph).encode() if path.suffix == ".pbtxt" else graph.SerializeToString()


def write_graph(graph, path) -> None:
    """Writes a GraphDef or MetaGraphDef in the format of `path`'s extension, atomically.

        before:  write_graph(meta, "out.meta")   # a crash mid-write could leave a truncated out.meta
        after:   out.meta is the whole graph or, on failure, what it was before (an OSError names out.meta)
    """
    path = Path(path)
    tmp = temp_file_beside(path, graph_bytes(graph, path))
    try:
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise user_path_error(e, path) from None


def new_file_mode() -> int:
    """The mode a file the user creates gets: 0666 less the umask (0644 under umask 022).

    mkstemp's files are 0600 whatever the umask; outputs are ordinary files the user shares and reads."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def user_path_error(error: OSError, path) -> OSError:
    """`error` naming the user's `path` instead of a temporary file beside it (or no file)."""
    return type(error)(error.errno, error.strerror or str(error), str(path))


def temp_file_beside(path, payload: bytes) -> str:
    """Writes `payload` to a new temporary file in `path`'s folder (created if missing), flushed to disk,
    with the mode of a new file; returns its name. Renaming it over `path` commits it. OSError names `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=str(path.parent))
    except OSError as e:
        raise user_path_error(e, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, new_file_mode())
    except OSError as e:
        os.unlink(tmp)
        raise user_path_error(e, path) from None
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def stage_defs_of(meta: meta_graph_pb2.MetaGraphDef | None) -> list[StageDef]:
    """The StageDefs kept in a MetaGraphDef (copies)."""
    if meta is None or STAGES_COLLECTION not in meta.collection_def:
        return []
    result = []
    for i, raw in enumerate(meta.collection_def[STAGES_COLLECTION].bytes_list.value):
        try:
            result.append(StageDef.FromString(raw))
        except message.DecodeError as e:
            raise GraphError(f"collection {STAGES_COLLECTION!r} entry {i} is not a StageDef: {e}") from None
    return result


def collection_targets(meta: meta_graph_pb2.MetaGraphDef | None) -> set[str]:
    """Node names in the collections the training step fetches (train_op, losses, summaries, ...)."""
    if meta is None:
        return set()
    names: set[str] = set()
    for key in TARGET_COLLECTIONS:
        if key in meta.collection_def:
            names.update(parse_tensor_name(v).node for v in meta.collection_def[key].node_list.value)
    return names


def store_stage_defs(meta: meta_graph_pb2.MetaGraphDef, stage_defs: list[StageDef]) -> None:
    if not stage_defs:
        return
    values = meta.collection_def[STAGES_COLLECTION].bytes_list.value
    del values[:]
    values.extend(sd.SerializeToString() for sd in stage_defs)
