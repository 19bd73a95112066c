"""Graphs for the inspection tests (diff, explain, verify, renderers, CLI), and golden-file helpers.

Set SMARTSTAGE_UPDATE_GOLDEN=1 to rewrite the golden files under tests/golden/ from the current output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

import smartstage as ss
from tests.builder import G, N

GOLDEN = Path(__file__).parent / "golden"


def tiny_graph():
    #   reader -> put ~~ take -> hash -----------> lookup(w) -> loss
    #                     \--> upper --> concat --/ (via as_number)
    #   axis (a constant) feeds lookup; w is a variable
    return G(
        N("reader", "Placeholder", dtype=tf.string),
        N("q", "FIFOQueueV2", component_types=[tf.string], shapes=[], capacity=2, shared_name="q"),
        N("put", "QueueEnqueueV2", ["q", "reader"], Tcomponents=[tf.string]),
        N("take", "QueueDequeueV2", ["q"], component_types=[tf.string]),
        N("hash", "StringToHashBucketFast", ["take"], num_buckets=10),
        N("upper", "StringUpper", ["take"]),
        N("w", "VariableV2", dtype=tf.float32, shape=[10, 4]),
        N("w/read", "Identity", ["w"], T=tf.float32),
        N("axis", "Const", dtype=tf.int32, value=np.int32(0)),
        N("lookup", "GatherV2", ["w/read", "hash", "axis"], Tparams=tf.float32, Tindices=tf.int64, Taxis=tf.int32),
        N("loss", "Sum", ["lookup", "axis"], T=tf.float32, Tidx=tf.int32),
        N("as_number", "StringToNumber", ["upper"], out_type=tf.float32),
        N("total", "AddV2", ["loss", "as_number"], T=tf.float32),
    )


def no_stage_graph():
    return G(N("x", "Placeholder", dtype=tf.float32), N("y", "Identity", ["x"], T=tf.float32))


def deeprec_example(workdir):
    """DeepRec's SmartStage documentation example, as a MetaGraphDef (smartstage.examples)."""
    from smartstage.examples import deeprec_smart_stage_example, export_meta_graph_def, write_deeprec_example_data

    path = write_deeprec_example_data(Path(workdir) / "1.txt")
    graph = tf.Graph()
    with graph.as_default():
        deeprec_smart_stage_example(path, ss.staged, mark_target=ss.mark_target_node)
        return export_meta_graph_def(graph)


def dlrm_example(workdir):
    """The DLRM-like model of smartstage.examples (hashing, vocabulary tables, crosses, Adagrad) as a
    MetaGraphDef, reading a small synthetic Criteo-like CSV in `workdir`."""
    from smartstage.examples import build_dlrm, export_meta_graph_def, prepare_criteo

    files = prepare_criteo(Path(workdir) / "criteo", 64, seed=0)
    graph = tf.Graph()
    with graph.as_default():
        build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=ss.staged)
        return export_meta_graph_def(graph)


def demo_example(workdir):
    from smartstage.cli import demo_graph

    return demo_graph(workdir)


def check_golden(name: str, text: str) -> None:
    """Compares `text` with tests/golden/<name>; SMARTSTAGE_UPDATE_GOLDEN=1 rewrites the file instead."""
    path = GOLDEN / name
    if os.environ.get("SMARTSTAGE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}: run with SMARTSTAGE_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        a, b = expected.splitlines(), text.splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise AssertionError(
            f"{name} differs from its golden file at line {first + 1}:\n"
            f"  golden: {a[first] if first < len(a) else '(end)'}\n  now:    {b[first] if first < len(b) else '(end)'}\n"
            "if the change is intended, rerun with SMARTSTAGE_UPDATE_GOLDEN=1 and review the diff")
