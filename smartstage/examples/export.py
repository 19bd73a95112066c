"""Exporting a built example graph: a GraphDef, a MetaGraphDef with its collections, or a file.

    graph_def = export_graph_def(model.graph)            # nodes only: collections are lost
    meta = export_meta_graph_def(model.graph)            # nodes + collections (variables, train_op,
                                                         # queue runners, table initializers, ...)
    graph = import_meta_graph_def(meta)                  # a new tf.Graph with the collections back
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.examples.graph_mode import require_a_graph

GraphLike = Union[tf.Graph, graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef]


def export_graph_def(graph: Optional[tf.Graph] = None) -> graph_pb2.GraphDef:
    """The GraphDef of `graph` (default: the default graph; eager mode: pass the graph)."""
    return require_a_graph(graph, "export_graph_def()").as_graph_def()


def export_meta_graph_def(
    graph: Optional[tf.Graph] = None, *, with_saver: bool = False, clear_devices: bool = False
) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef of `graph` with every collection TensorFlow can serialise.

    `with_saver=True` first adds a `tf.compat.v1.train.Saver` to `graph` (its save/restore nodes)
    and stores its SaverDef, so the import can restore checkpoints.
    """
    graph = require_a_graph(graph, "export_meta_graph_def()")
    saver_def = None
    if with_saver:
        with graph.as_default():
            savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
            saver = savers[0] if savers else tf.compat.v1.train.Saver()
            if not savers:
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
            saver_def = saver.as_saver_def()
    with graph.as_default():  # TF2's eager mode exports no meta graph outside a graph
        return tf.compat.v1.train.export_meta_graph(graph=graph, saver_def=saver_def, clear_devices=clear_devices)


def import_meta_graph_def(meta_graph_def: meta_graph_pb2.MetaGraphDef) -> tf.Graph:
    """A new tf.Graph holding `meta_graph_def`'s nodes and collections (names unchanged)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta_graph_def)
    return graph


def write_graph_file(graph: GraphLike, path: Union[str, os.PathLike]) -> str:
    """Writes `graph` by the suffix of `path`: .pb (binary GraphDef), .pbtxt (text), .meta (MetaGraphDef).

    A tf.Graph is exported first; a .meta file from a bare GraphDef has no collections.
    """
    suffix = Path(path).suffix
    if suffix not in (".pb", ".pbtxt", ".meta"):
        raise ValueError(f"write_graph_file: {path} must end in .pb, .pbtxt or .meta")
    if isinstance(graph, tf.Graph):
        message = export_meta_graph_def(graph) if suffix == ".meta" else export_graph_def(graph)
    elif suffix == ".meta" and isinstance(graph, graph_pb2.GraphDef):
        message = meta_graph_pb2.MetaGraphDef(graph_def=graph)
    elif suffix != ".meta" and isinstance(graph, meta_graph_pb2.MetaGraphDef):
        message = graph.graph_def
    else:
        message = graph
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".pbtxt":
        Path(path).write_text(text_format.MessageToString(message), encoding="utf-8")
    else:
        Path(path).write_bytes(message.SerializeToString())
    return str(path)
