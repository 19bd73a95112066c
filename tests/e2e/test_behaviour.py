"""Behaviour: each graph runs before and after optimize() in real sessions, with one prefetch thread,
and every fetched value is identical at every step."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.inspection.replay import compare_runs
from smartstage.config.options import enable_smart_stage
from smartstage.optimizer import optimize

ON = enable_smart_stage()
STEPS = 12
ROWS = 64


def _dataset_features(batch=4, rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    cats = np.array([f"c{int(i)}" for i in rng.integers(0, 50, rows)])
    dense = rng.standard_normal((rows, 3)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices({"cat": cats, "dense": dense}).batch(batch, drop_remainder=True)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()


def _embed(ids, name="emb", buckets=50, dim=4):
    w = tf.compat.v1.get_variable(name, [buckets, dim], initializer=tf.compat.v1.random_uniform_initializer(seed=7))
    return tf.nn.embedding_lookup(w, ids)


def _train(logits):
    loss = tf.reduce_mean(tf.square(logits))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
    return loss, train_op


def cond_graph():
    f = ss.staged(_dataset_features())
    ids = tf.strings.to_hash_bucket_fast(f["cat"], 50)
    dense = tf.cond(tf.reduce_sum(f["dense"]) > 0, lambda: f["dense"] * 2.0, lambda: f["dense"] - 1.0)
    logits = tf.reduce_sum(_embed(ids), axis=1) + tf.reduce_sum(dense, axis=1)
    return _train(logits)


def dropout_graph():
    f = ss.staged(_dataset_features())
    dense = tf.compat.v1.nn.dropout(tf.math.log1p(tf.abs(f["dense"])), rate=0.5, seed=3)
    logits = tf.reduce_sum(_embed(tf.strings.to_hash_bucket_fast(f["cat"], 50)), axis=1) + tf.reduce_sum(dense, 1)
    return _train(logits)


def summary_graph():
    f = ss.staged(_dataset_features())
    norm = (f["dense"] - 0.5) / 2.0
    summary = tf.compat.v1.summary.scalar("dense_mean", tf.reduce_mean(norm))
    logits = tf.reduce_sum(_embed(tf.strings.to_hash_bucket_fast(f["cat"], 50)), axis=1) + tf.reduce_sum(norm, 1)
    loss, train_op = _train(logits)
    return loss, train_op, summary


def two_stage_graph():
    a = ss.staged(_dataset_features(seed=1), name="stage_a")
    b = ss.staged(_dataset_features(seed=2), name="stage_b")
    ids_a = tf.strings.to_hash_bucket_fast(a["cat"], 50)
    ids_b = tf.strings.to_hash_bucket_fast(tf.strings.join([b["cat"], "x"]), 50)
    joined = tf.reduce_sum(_embed(ids_a, "ea"), 1) + tf.reduce_sum(_embed(ids_b, "eb"), 1) + tf.reduce_sum(
        a["dense"] * b["dense"], 1)
    return _train(joined)


def vocab_graph(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(f"c{i}" for i in range(0, 50, 2)) + "\n")
    f = ss.staged(_dataset_features())
    table = tf.compat.v1.lookup.StaticHashTable(
        tf.compat.v1.lookup.TextFileInitializer(str(vocab), tf.string, tf.compat.v1.lookup.TextFileIndex.WHOLE_LINE,
                                                tf.int64, tf.compat.v1.lookup.TextFileIndex.LINE_NUMBER), -1)
    ids = table.lookup(f["cat"]) + 1
    return _train(tf.reduce_sum(_embed(ids, buckets=30), 1))


def _build(builder, *args):
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(42)
        out = builder(*args)
        return tf.compat.v1.train.export_meta_graph(), [t.name for t in out]


@pytest.mark.parametrize("builder, expect_moved", [
    (cond_graph, {"If", "StatelessIf"}),
    (dropout_graph, {"RandomUniform"}),
    (summary_graph, {"StringToHashBucketFast"}),
    (two_stage_graph, {"StringJoin"}),
])
def test_values_identical_step_by_step(builder, expect_moved):
    meta, fetches = _build(builder)
    result = optimize(meta, ON)
    assert result.changed
    moved_ops = {n.op for n in result.original_graph_def.node if n.name in result.moved()}  # a fold maps them
    assert moved_ops & expect_moved, f"expected one of {expect_moved} to move, moved ops: {sorted(moved_ops)}"
    comparison = compare_runs(meta, result.meta_graph_def, fetches, STEPS)
    assert comparison.identical, comparison.describe()
    assert len(comparison.before.values) == STEPS


def test_vocabulary_lookup_moves_and_values_stay_identical(tmp_path):
    meta, fetches = _build(vocab_graph, tmp_path)
    result = optimize(meta, ON)
    moved_ops = {n.op for n in result.original_graph_def.node if n.name in result.moved()}  # a fold maps them
    assert "LookupTableFindV2" in moved_ops
    comparison = compare_runs(meta, result.meta_graph_def, fetches, STEPS)
    assert comparison.identical, comparison.describe()


def test_summary_stays_on_the_main_side():
    meta, _ = _build(summary_graph)
    result = optimize(meta, ON)
    summary = next(n.name for n in result.graph_def.node if n.op == "ScalarSummary")
    assert summary not in result.moved()
    assert result.partitions[0].pinned[summary].kind == "target"


def test_a_broken_rewrite_is_caught_by_the_comparison():
    meta, fetches = _build(dropout_graph)
    result = optimize(meta, ON)
    broken = type(result.meta_graph_def)()
    broken.CopyFrom(result.meta_graph_def)
    for n in broken.graph_def.node:
        if n.op == "Log1p":
            n.op = "Exp"
    assert not compare_runs(meta, broken, fetches, 3).identical
