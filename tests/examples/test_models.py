"""Every example builder builds, trains in a real session, and is deterministic step by step.

Other tests compare runs before and after optimization step by step, so two builds with the same
seed must give bit-identical losses, whichever reader and session they use.
"""

import numpy as np
import pytest
import tensorflow as tf

from smartstage.examples import (
    DLRMOptions,
    InputOptions,
    WideDeepOptions,
    build_demo,
    build_dlrm,
    build_wide_deep,
    deeprec_smart_stage_example,
    export_meta_graph_def,
    import_meta_graph_def,
    run_steps,
    write_graph_file,
)

STEPS = 6


def train(builder, criteo, steps=STEPS, monitored=False, **kwargs):
    """Builds `builder` in a fresh graph, trains `steps` steps, returns (model, [loss, ...])."""
    graph = tf.Graph()
    with graph.as_default():
        model = builder(criteo.data_path, criteo.vocabulary_paths, **kwargs)
    fetches = {"loss": model.loss, "train": model.train_op}
    init = None if monitored else model.init_op
    results = run_steps(graph, fetches, steps, init_op=init, monitored=monitored)
    return model, np.array([r["loss"] for r in results])


@pytest.fixture(scope="module")
def dlrm_reference(criteo):
    """The default DLRM (tf.data reader, plain Session): its graph, model and STEPS losses."""
    return train(build_dlrm, criteo)


@pytest.fixture(scope="module")
def dlrm_queue(criteo):
    """The DLRM on the queue readers, trained in a MonitoredTrainingSession."""
    return train(build_dlrm, criteo, monitored=True, input_options=InputOptions(reader="queue"))


def test_dlrm_is_identical_across_builds_readers_and_sessions(dlrm_reference, dlrm_queue):
    _, reference = dlrm_reference
    _, queue = dlrm_queue
    assert len(reference) == STEPS and np.all(np.isfinite(reference))
    assert len(set(reference.tolist())) > 1, "the model trains: the loss changes"
    np.testing.assert_array_equal(reference, queue)


def test_dlrm_preprocessing_in_the_dataset_gives_the_same_losses(criteo, dlrm_reference):
    opts = InputOptions(reader="dataset", iterator="initializable", preprocess_in_dataset=True, prefetch=-1)
    model, in_dataset = train(build_dlrm, criteo, monitored=True, input_options=opts)
    assert "dense" in model.features, "the stage took the preprocessed features"
    # tf.data optimizes its map function on its own, so the last bit of a float may differ.
    np.testing.assert_allclose(dlrm_reference[1], in_dataset, rtol=1e-6)
    # The iterator initializer travels in LOCAL_INIT_OP: an imported copy initialises it too.
    imported = import_meta_graph_def(export_meta_graph_def(model.graph))
    again = run_steps(imported, [model.loss.name, model.train_op.name], 2, monitored=True)
    np.testing.assert_array_equal(in_dataset[:2], [a[0] for a in again])


def test_one_shot_iterator_cannot_capture_vocabulary_tables(criteo):
    with tf.Graph().as_default(), pytest.raises(ValueError, match="initializable"):
        build_dlrm(criteo.data_path, criteo.vocabulary_paths, input_options=InputOptions(preprocess_in_dataset=True))


def test_dlrm_with_hashing_only_and_reference_variables(criteo):
    graph = tf.Graph()
    with graph.as_default():
        model = build_dlrm(criteo.data_path, None, options=DLRMOptions(use_resource=False))
    ops = {node.op for node in graph.as_graph_def().node}
    assert "VariableV2" in ops and "VarHandleOp" not in ops
    assert "HashTableV2" not in ops
    losses = run_steps(graph, model.loss, 2, init_op=model.init_op)
    assert np.all(np.isfinite(losses))


def test_dlrm_graph_has_the_preprocessing_ops(dlrm_reference):
    ops = {node.op for node in dlrm_reference[0].graph.as_graph_def().node}
    expected = {
        "DecodeCSV", "StringToHashBucketFast", "LookupTableFindV2", "HashTableV2", "StringSplit",
        "SparseCross", "Bucketize", "Log1p", "IsNan", "Cast", "ResourceGather",
        "SparseFillEmptyRows", "BatchMatMulV2", "ResourceSparseApplyAdagrad", "Unique",
    }
    assert expected <= ops, sorted(expected - ops)


def test_wide_deep_trains_identically_on_both_readers(criteo):
    _, dataset = train(build_wide_deep, criteo, input_options=InputOptions(reader="dataset"))
    _, queue = train(build_wide_deep, criteo, monitored=True, input_options=InputOptions(reader="queue"))
    assert len(set(dataset.tolist())) > 1
    np.testing.assert_array_equal(dataset, queue)


def test_stage_fn_gets_the_parsed_columns_and_its_result_is_used(criteo):
    seen = {}

    def identity_stage(features):
        seen.update(features)
        return {key: tf.identity(value, name=f"staged_{key}") for key, value in features.items()}

    with tf.Graph().as_default() as graph:
        model = build_dlrm(criteo.data_path, criteo.vocabulary_paths, stage_fn=identity_stage)
    assert len(seen) == 40 and seen["C1"].dtype == tf.string and seen["I1"].dtype == tf.float32
    assert model.parsed["C1"] is seen["C1"] and model.features["C1"].op.name == "staged_C1"
    consumers = {op.type for op in graph.get_operations() if seen["C1"] in list(op.inputs)}
    assert consumers == {"Identity"}, "every use of a parsed column goes through the stage"


def test_stage_fn_must_keep_the_keys(criteo):
    with tf.Graph().as_default(), pytest.raises(TypeError, match="stage_fn"):
        build_dlrm(criteo.data_path, None, stage_fn=lambda features: list(features.values()))


def test_meta_graph_round_trip_keeps_training_identical(dlrm_queue, dlrm_reference):
    model, _ = dlrm_queue
    meta = export_meta_graph_def(model.graph)
    assert meta.collection_def["queue_runners"].bytes_list.value, "the queue runners are exported"
    names = model.fetch_names()
    imported = import_meta_graph_def(meta)
    after = run_steps(imported, [names["loss"], names["train_op"]], 4, monitored=True)
    np.testing.assert_array_equal(dlrm_reference[1][:4], [a[0] for a in after])


def test_demo_trains(criteo):
    graph = tf.Graph()
    with graph.as_default():
        model = build_demo(criteo.data_path)
    losses = [r[0] for r in run_steps(graph, [model.loss, model.train_op], 30, init_op=model.init_op)]
    assert len(losses) == 30 and np.mean(losses[-10:]) < np.mean(losses[:10])


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt", ".meta"])
def test_write_graph_file(criteo, tmp_path, suffix):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    with tf.Graph().as_default() as graph:
        build_demo(criteo.data_path)
    path = write_graph_file(graph, tmp_path / f"demo{suffix}")
    if suffix == ".pbtxt":
        nodes = text_format.Parse(open(path).read(), graph_pb2.GraphDef()).node
    elif suffix == ".pb":
        nodes = graph_pb2.GraphDef.FromString(open(path, "rb").read()).node
    else:
        meta = meta_graph_pb2.MetaGraphDef.FromString(open(path, "rb").read())
        assert "train_op" in meta.collection_def
        nodes = meta.graph_def.node
    assert {n.name for n in nodes} == {n.name for n in graph.as_graph_def().node}


def test_deeprec_example_gives_the_documented_target(deeprec_data):
    given = []

    def record(features):
        given.append(features)
        return features

    graph = tf.Graph()
    with graph.as_default():
        target = deeprec_smart_stage_example(deeprec_data, record)
    assert len(given) == 1 and [t.op.type for t in given[0]] == ["DecodeCSV", "DecodeCSV"]
    ops = [node.op for node in graph.as_graph_def().node]
    for op in ("TextLineReaderV2", "ReaderReadV2", "QueueDequeueManyV2", "StringToHashBucket", "GatherV2", "AsString"):
        assert op in ops
    values = run_steps(graph, target, 5, monitored=True)
    assert len(values) == 5 and values[0].shape == (4, 3)
    assert values[0][0].tolist() == [b"1.000000"] * 3
    assert values[0][2].tolist() == [b"value0", b"value1", b"xxx"]
    assert values[1][3].tolist() == [b"value2", b"value3", b"xxx"]


def test_timing_cli_smoke(capsys):
    from smartstage.examples import timing

    assert timing.main(["--rows", "200", "--steps", "3", "--only", "demo"]) == 0
    out = capsys.readouterr().out
    assert "train steps/s" in out and "demo" in out


def test_dlrm_benchmark_sizes_train(criteo):
    # A fused embedding table, many crosses, every dense column bucketized.
    opts = InputOptions(batch_size=64)
    _, losses = train(build_dlrm, criteo, steps=2, options=DLRMOptions.benchmark(), input_options=opts)
    assert len(losses) == 2 and np.all(np.isfinite(losses))


def test_wide_deep_rejects_an_unknown_optimizer():
    with pytest.raises(ValueError, match="deep_optimizer"):
        WideDeepOptions(deep_optimizer="sgd")
