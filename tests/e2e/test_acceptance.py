"""Acceptance: DeepRec's SmartStage example gives exactly the documented split, and the DLRM-like and
Wide&Deep-like models train identically, step by step, before and after optimize()."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage import examples
from smartstage.inspection.replay import compare_runs

ON = ss.enable_smart_stage()


def _export(build):
    g = tf.Graph()
    with g.as_default():
        out = build()
        return tf.compat.v1.train.export_meta_graph(), out


def test_deeprec_smart_stage_example_moves_exactly_hash_and_concat(tmp_path):
    data = examples.write_deeprec_example_data(str(tmp_path / "1.txt"))
    meta, target = _export(lambda: examples.deeprec_smart_stage_example(
        data, ss.staged, mark_target=ss.mark_target_node))
    result = ss.optimize(meta, ON)
    ops = {n.name: n.op for n in result.graph_def.node}
    moved = {ops[n] for n in result.moved()}
    # string_to_hash_bucket and the concat with the constant move (the constant's auto-packed pair of
    # that concat, an input of the final concat only, moves with it) ...
    assert moved == {"StringToHashBucket", "ConcatV2", "Pack"}
    moved_concats = [n for n in result.moved() if ops[n] == "ConcatV2"]
    assert len(moved_concats) == 1
    # ... the embedding lookup and the final concat stay.
    (p,) = result.partitions
    lookup = next(n for n in p.pinned if ops[n] in ("GatherV2", "Gather"))
    assert p.pinned[lookup].kind == "variable"
    assert p.pinned[target.op.name].kind in ("target", "variable")
    comparison = compare_runs(meta, result.meta_graph_def, [target.name], steps=20)
    assert comparison.identical, comparison.describe()


@pytest.mark.parametrize("builder", [examples.build_dlrm, examples.build_wide_deep])
def test_models_train_identically_for_50_steps(tmp_path, builder):
    files = examples.prepare_criteo(tmp_path, num_rows=2000)
    meta, model = _export(lambda: builder(files.data_path, files.vocabulary_paths, stage_fn=ss.staged))
    result = ss.optimize(meta, ON)
    # the moved ops by their types in the input graph: the folded stage runs them in its dataset's map
    moved_ops = {n.op for n in meta.graph_def.node if n.name in result.moved()}
    for op in ("StringToHashBucketFast", "LookupTableFindV2", "Log1p", "Cast"):
        assert op in moved_ops, f"{op} should move; moved: {sorted(moved_ops)}"
    assert [r for r in result.reports if r.name == "fold_dataset"][0].changed
    fetches = [model.loss.name, model.predictions.name]
    # sessions that rewrite what they run (the default), as the map's body is rewritten (passes/dataset_map.py)
    comparison = compare_runs(meta, result.meta_graph_def, fetches, steps=50, config=tf.compat.v1.ConfigProto())
    assert comparison.identical, comparison.describe()
    assert len(comparison.before.values) == 50
