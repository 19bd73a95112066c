"""A TensorBoard logdir with the graph before and after the rewrite, as two runs.

    write_tensorboard(result.original_graph_def, result.graph_def, "logs/")
    ->  logs/before/events.out.tfevents...   logs/after/events.out.tfevents...
    tensorboard --logdir logs/     # the Graphs dashboard has a run selector: before | after

Written with tf.compat.v1.summary.FileWriter: a graph event per run, and for a MetaGraphDef a
meta-graph event too. Works whether or not eager execution is on.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.graph.load import load_graph

RUNS = ("before", "after")


def write_tensorboard(before, after, logdir, *, runs: tuple[str, str] = RUNS) -> list[str]:
    """Writes `before` and `after` (any form load_graph takes) as runs `runs` under `logdir`.

    Returns the two run directories. A run directory's old event files are left in place (TensorBoard
    shows the newest graph of a run).
    """
    out = []
    for run, graph in zip(runs, (before, after)):
        loaded = load_graph(graph)
        run_dir = os.path.join(os.fspath(logdir), run)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        _write_run(run_dir, loaded.graph_def, loaded.meta_graph_def)
        out.append(run_dir)
    return out


def _write_run(run_dir: str, graph_def: graph_pb2.GraphDef, meta: meta_graph_pb2.MetaGraphDef | None) -> None:
    # FileWriter refuses to run eagerly; inside a graph context it does not care which mode the caller uses.
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriter(run_dir)
        try:
            writer.add_graph(None, graph_def=graph_def)  # what the Graphs dashboard draws
            if meta is not None:
                writer.add_meta_graph(meta)  # collections, signatures: shown with the graph
            writer.flush()
        finally:
            writer.close()
