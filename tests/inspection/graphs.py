"""Graphs for the inspection tests (diff, explain, verify, renderers, CLI), and golden-file helpers.

Set SMARTSTAGE_UPDATE_GOLDEN=1 to rewrite the golden files under tests/inspection/golden/ from the current output.
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


def dlrm_like_graph(rows: int = 64, batch: int = 8):
    """A small DLRM-like training graph, built here so its golden files change only with SmartStage.

        tf.data (in-graph constants) -> iterator -> stage -> I1, I2: fill, log1p, scale -> bottom MLP(w) -\
                                                          -> C1..C3: hash -> embeddings(w) ----------------+-> dot interaction
                                                          -> C4: vocabulary table lookup -> embedding(w) -/   -> top MLP(w)
                                                          -> C1 x C2: join, hash -> embedding(w) ----------------> concat
                                                          -> I1: bucketize -> embedding(w) ----------------------/  -> loss -> Adagrad
    """
    rng = np.random.default_rng(0)
    columns = {"label": rng.integers(0, 2, rows).astype(np.float32),
               "I1": rng.lognormal(1.0, 1.0, rows).astype(np.float32),
               "I2": np.where(rng.random(rows) < 0.2, np.nan, rng.lognormal(0.0, 1.0, rows)).astype(np.float32)}
    for c in ("C1", "C2", "C3", "C4"):
        columns[c] = np.array([f"{c.lower()}_{v}" for v in rng.integers(0, 20, rows)])
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        ds = tf.data.Dataset.from_tensor_slices(columns).batch(batch, drop_remainder=True).repeat()
        parsed = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        f = ss.staged(parsed)
        with tf.name_scope("preprocess"):
            dense = []
            for c in ("I1", "I2"):
                x = tf.where(tf.math.is_nan(f[c]), tf.zeros_like(f[c]), f[c], name=f"fill_{c}")
                dense.append(tf.math.log1p(tf.maximum(x, 0.0)) / 3.0)
            dense = tf.stack(dense, axis=1, name="dense")
            ids = {c: tf.strings.to_hash_bucket_fast(f[c], 50, name=f"hash_{c}") for c in ("C1", "C2", "C3")}
            table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant([f"c4_{i}" for i in range(10)]), tf.range(10, dtype=tf.int64)), default_value=10)
            ids["C4"] = table.lookup(f["C4"], name="lookup_C4")
            ids["C1xC2"] = tf.strings.to_hash_bucket_fast(tf.strings.join([f["C1"], f["C2"]], "_"), 50, name="cross")
            ids["bucket_I1"] = tf.cast(tf.raw_ops.Bucketize(input=f["I1"], boundaries=[1.0, 3.0, 10.0]), tf.int64)
            label = tf.reshape(f["label"], [-1, 1], name="label")
        init = tf.compat.v1.glorot_uniform_initializer(seed=3)

        def layer(x, width, name, activation=tf.nn.relu):
            with tf.compat.v1.variable_scope(name):
                w = tf.compat.v1.get_variable("kernel", [x.shape[1], width])
                b = tf.compat.v1.get_variable("bias", [width], initializer=tf.compat.v1.zeros_initializer())
                y = tf.nn.bias_add(tf.matmul(x, w), b)
                return activation(y) if activation else y

        with tf.compat.v1.variable_scope("dlrm", use_resource=True, initializer=init):
            bottom = layer(dense, 4, "bottom")
            embedded = [bottom]
            for name, x in ids.items():
                table_w = tf.compat.v1.get_variable(f"emb_{name}", [51, 4])
                embedded.append(tf.nn.embedding_lookup(table_w, x, name=f"embed_{name}"))
            stacked = tf.stack(embedded, axis=1, name="stack")
            interaction = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, 49], name="interaction")
            hidden = layer(tf.concat([bottom, interaction], 1), 8, "top")
            logits = layer(hidden, 1, "logit", activation=None)
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(label, logits)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step, name="train_op")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        return tf.compat.v1.train.export_meta_graph(graph=graph)


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
    from smartstage.cli.demo import demo_graph

    return demo_graph(workdir)


def check_golden(name: str, text: str) -> None:
    """Compares `text` with tests/inspection/golden/<name>; SMARTSTAGE_UPDATE_GOLDEN=1 rewrites the file instead."""
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
