"""The fold_dataset pass on small graphs: what folds into the dataset, what stays and why, and the values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.errors import ConfigError
from smartstage.passes.fold_dataset import SCOPE, FoldFit

READ = f"stage/{SCOPE}/IteratorGetNext"
ROWS, BATCH = 40, 4


def _rows():
    return tf.data.Dataset.range(ROWS).map(
        lambda i: {"id": tf.strings.as_string(i % 5), "x": tf.cast(i, tf.float32)}).batch(BATCH)


def _table():
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(["1", "2"], [1, 2], key_dtype=tf.string, value_dtype=tf.int64), 0)


def lookup_graph(form="initializable", body=None, capacity=4, num_threads=1, staged_body=None):
    #   range -> map -> batch ==MakeIterator==> IteratorV2 -> IteratorGetNext -> put ~~ take
    #   take["x"] -> sqrt ----------------------\
    #   take["id"] -> lookup(table) -> cast ---> add -> mul(w) -> loss -> train
    # expand_stage moves sqrt, lookup, cast and add to the prefetch side; the fold puts them in the map.
    graph = tf.Graph()
    with graph.as_default():
        if form == "initializable":
            iterator = tf.compat.v1.data.make_initializable_iterator(_rows())
        elif form == "one_shot":
            iterator = tf.compat.v1.data.make_one_shot_iterator(_rows())
        else:  # DeepRec's reinitializable iterator: one structure, a train and an eval dataset
            train = _rows()
            iterator = tf.compat.v1.data.Iterator.from_structure(tf.compat.v1.data.get_output_types(train),
                                                                 tf.compat.v1.data.get_output_shapes(train))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS,
                                           iterator.make_initializer(train, name="train_init"))
            iterator.make_initializer(_rows().skip(2), name="eval_init")
        features = iterator.get_next()
        if staged_body is not None:  # work the user put on the prefetch side with staged()
            features = dict(features, x=staged_body(features))
        features = ss.staged(features, capacity=capacity, num_threads=num_threads)
        table = _table()
        x = (body or (lambda f: tf.sqrt(f["x"]) + tf.cast(table.lookup(f["id"]), tf.float32)))(features)
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(x * w, name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
        if form == "initializable":
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def optimized(meta, **options):
    return ss.optimize(meta, ss.enable_smart_stage(tf.compat.v1.ConfigProto()), targets=["train", "loss"], **options)


def fold_report(result):
    (report,) = [r for r in result.reports if r.name == "fold_dataset"]
    return report


def nodes_of(result):
    return {n.name: n for n in result.graph_def.node}


def test_the_moved_work_becomes_the_datasets_map_and_the_step_reads_the_iterator():
    result = optimized(lookup_graph())
    report = fold_report(result)
    fit = report.details["stage"]
    assert report.changed and fit.folds
    assert (fit.read, fit.iterator, fit.makers, fit.one_shot) == ("IteratorGetNext", "IteratorV2", ("MakeIterator",),
                                                                  False)
    assert set(fit.body) == {"Const", "hash_table_Lookup/LookupTableFindV2", "Sqrt", "Cast", "add"}
    assert (fit.captures, fit.outputs) == (("hash_table:0",), ("add:0",))
    assert (fit.num_parallel_calls, fit.buffer_size, fit.deterministic) == (1, 4, True)
    nodes = nodes_of(result)
    mapped = nodes[f"stage/{SCOPE}/ParallelMapDatasetV2"]
    assert mapped.input == ["BatchDatasetV2", "hash_table:0", f"stage/{SCOPE}/num_parallel_calls"]
    assert mapped.attr["deterministic"].s == b"true"
    assert nodes[f"stage/{SCOPE}/PrefetchDataset"].input[0] == mapped.name
    assert nodes["MakeIterator"].input == [f"stage/{SCOPE}/PrefetchDataset", "IteratorV2"]
    assert nodes[READ].input == ["IteratorV2"]
    assert list(nodes["IteratorV2"].attr["output_types"].list.type) == [tf.float32.as_datatype_enum]
    assert nodes["mul"].input[0] == READ
    gone = {"stage/buffer", "stage/put", "stage/take", "stage/close", "stage/cancel", "stage/size", "stage/is_closed",
            "stage/ready_buffer", "stage/ready_put", "stage/ready_check", "stage/ready_token", "IteratorGetNext",
            "Sqrt", "add", "Cast", "hash_table_Lookup/LookupTableFindV2"}
    assert not gone & set(nodes)
    assert {"hash_table", "IteratorV2", "MakeIterator", "w"} <= set(nodes)  # user state and names kept
    assert ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def) == []  # no runtime starts threads
    with tf.Graph().as_default():  # every input resolves, every function exists
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)


@pytest.mark.parametrize("form", ["initializable", "one_shot", "reinitializable"])
def test_every_iterator_form_folds_and_optimizing_twice_gives_the_same_graph(form):
    meta = lookup_graph(form)
    first, second = optimized(meta), optimized(meta)
    fit = fold_report(first).details["stage"]
    assert fit.folds, fit.skipped
    assert first.graph_def == second.graph_def  # scratch function names do not depend on the process
    nodes = nodes_of(first)
    if form == "one_shot":
        factory = nodes["OneShotIterator"].attr["dataset_factory"].func.name
        assert factory.startswith(f"stage_{SCOPE}_fn_") and fit.makers == ()
    elif form == "reinitializable":  # every dataset that initializes the iterator gets the same map
        assert fit.makers == ("train_init", "eval_init")
        assert nodes["train_init"].input[0] == f"stage/{SCOPE}/PrefetchDataset"
        assert nodes["eval_init"].input[0] == f"stage/{SCOPE}_1/PrefetchDataset"


def _random(f):
    return f["x"] + tf.random.uniform([BATCH])


def _mutable(f):
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, 0)
    return f["x"] + tf.cast(table.lookup(f["id"]), tf.float32)


def _stateful_py_func(f):
    return tf.compat.v1.py_func(lambda x: x * 2, [f["x"]], tf.float32, stateful=True)


@pytest.mark.parametrize("body, named", [
    (_random, "RandomUniform"),
    (_mutable, "MutableHashTable"),
    (_stateful_py_func, "PyFunc"),
])
def test_a_stage_the_map_cannot_carry_keeps_its_buffer_and_the_reason_names_the_node(body, named):
    #   IteratorGetNext -> <stateful op> -> put ~~ take -> ... -> loss     (staged() put it on the prefetch side)
    result = optimized(lookup_graph(staged_body=body))
    report = fold_report(result)
    fit = report.details["stage"]
    (line,) = report.summary
    assert not fit.folds and named in fit.skipped and line.startswith("stage: keeps its buffer and lanes: "), line
    assert "stage/put" in nodes_of(result) and ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def)


def test_lanes_stay_selectable_and_the_option_is_checked():
    result = optimized(lookup_graph(), tf_data_stage="lanes")
    assert "fold_dataset" not in result.passes and "stage/put" in nodes_of(result)
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), tf_data_stage="lanes")
    assert ss.options_from_config(config).tf_data_stage == "lanes"
    assert ss.options_from_config(None).tf_data_stage == "fold"
    config.graph_options.rewrite_options.custom_optimizers[0].parameter_map["tf_data_stage"].s = b"threads"
    with pytest.raises(ConfigError, match="'tf_data_stage' must be one of \\['fold', 'lanes'\\], not 'threads'"):
        ss.options_from_config(config)
    with pytest.raises(ConfigError, match="tf_data_stage has no DeepRec spelling"):
        ss.enable_smart_stage(ss.ConfigProto(), tf_data_stage="lanes")


def test_a_stage_with_a_feed_dict_is_not_folded():
    #   IteratorGetNext -> mul(scale placeholder, fed from a constant per put) -> put ~~ take -> loss
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.data.make_initializable_iterator(_rows()).get_next()["x"]
        scale = tf.compat.v1.placeholder(tf.float32, [], name="scale")
        staged = ss.staged(x * scale, feed_dict={scale: 2.0}, capacity=2, num_threads=1)
        tf.identity(staged, name="loss")
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    result = ss.optimize(meta, ss.enable_smart_stage(tf.compat.v1.ConfigProto()), targets=["loss"])
    assert "feed_dict" in fold_report(result).details["stage"].skipped


def gpu_graph():
    #   IteratorGetNext -> put ~~ take -> sqrt, lookup(table) -> add -> [GPU:0] mul(w) -> loss -> train
    graph = tf.Graph()
    with graph.as_default():
        iterator = tf.compat.v1.data.make_initializable_iterator(_rows())
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        features = ss.staged(iterator.get_next(), capacity=4, num_threads=2)
        table = _table()
        x = tf.sqrt(features["x"]) + tf.cast(table.lookup(features["id"]), tf.float32)
        with tf.device("/device:GPU:0"):
            w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
            loss = tf.reduce_sum(x * w, name="loss")
            tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def test_gpu_folds_the_moved_work_and_one_thread_fills_the_gpu_resident_buffer():
    meta = gpu_graph()
    result = ss.optimize(meta, ss.enable_smart_stage(tf.compat.v1.ConfigProto(), do_smart_stage_gpu=True), targets=["train", "loss"])
    fit = fold_report(result).details["stage"]
    assert isinstance(fit, FoldFit) and fit.folds and fit.keeps_buffer
    nodes = nodes_of(result)
    assert nodes["stage/put"].input == ["stage/buffer", READ]  # the put carries the iterator's elements
    assert nodes["stage/buffer"].device == "/device:GPU:0" and nodes[READ].device == "/device:CPU:0"
    assert not {"Sqrt", "add", "IteratorGetNext"} & set(nodes)  # the body runs in the map
    (stage_def,) = ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def)
    assert (list(stage_def.boundary_tensors), stage_def.num_threads) == ([f"{READ}:0"], 1)
    soft = tf.compat.v1.ConfigProto(allow_soft_placement=True)  # no GPU here: TensorFlow places it on the CPU
    steps = ROWS // BATCH
    np.testing.assert_array_equal(run_flag_off(result.meta_graph_def, steps, soft), run_flag_off(meta, steps, soft))


# -- values: the optimized graph in a plain session against the stage run by its prefetch threads ----------


def run_flag_off(meta, steps, config=None):
    """The unoptimized graph: staged() run by SmartStage's prefetch threads (flag off)."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.import_meta_graph(meta)
        with tf.compat.v1.Session(config=config) as sess:
            _initialize(sess, graph)
            threads = ss.start_prefetch_threads(sess)
            try:
                return [sess.run(["loss:0", "train"])[0] for _ in range(steps)]
            finally:
                threads.stop()


def run_plain(meta, steps):
    """A graph that needs nothing of SmartStage: a plain Session, initializers, steps."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.import_meta_graph(meta)
        with tf.compat.v1.Session() as sess:
            _initialize(sess, graph)
            values = [sess.run(["loss:0", "train"])[0] for _ in range(steps)]
            with pytest.raises(tf.errors.OutOfRangeError):  # every batch trained once, then the end of input
                sess.run("loss:0")
            return values


def _initialize(sess, graph):
    sess.run([tf.compat.v1.global_variables_initializer(),
              *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.parametrize("capacity", [4, 40])
@pytest.mark.parametrize("form", ["initializable", "one_shot"])
def test_every_step_is_identical_to_the_flag_off_run(form, num_threads, capacity):
    meta = lookup_graph(form, capacity=capacity, num_threads=num_threads)
    result = optimized(meta)
    fit = fold_report(result).details["stage"]
    assert (fit.num_parallel_calls, fit.buffer_size) == (num_threads, capacity)
    steps = ROWS // BATCH
    np.testing.assert_array_equal(run_plain(result.meta_graph_def, steps), run_flag_off(meta, steps))


def _checked(limit):
    def body(f):
        #   take["x"] -> check(Assert x < limit) -^-> read(scale) -> mul -> loss   (the step waits on the check)
        #   take["x"] -> sqrt ----------------------------------------/
        check = tf.debugging.Assert(tf.reduce_all(f["x"] < limit), [f["x"]], name="check")
        scale = tf.compat.v1.get_variable("scale", [], initializer=tf.compat.v1.ones_initializer())
        with tf.control_dependencies([check]):
            return tf.sqrt(f["x"]) * scale.read_value()
    return body


def test_a_check_the_step_waited_on_runs_in_the_map_and_fails_the_element_it_checks():
    meta = lookup_graph(body=_checked(ROWS))
    result = optimized(meta)
    fit = fold_report(result).details["stage"]
    assert fit.folds and fit.waits and all(name.startswith("check") for name in fit.waits), fit
    np.testing.assert_array_equal(run_plain(result.meta_graph_def, ROWS // BATCH), run_flag_off(meta, ROWS // BATCH))
    failing = optimized(lookup_graph(body=_checked(30)))  # batches 0-6 pass (x < 28), batch 7 holds 28..31
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.import_meta_graph(failing.meta_graph_def)
        with tf.compat.v1.Session() as sess:
            _initialize(sess, graph)
            for _ in range(7):
                sess.run("train")
            with pytest.raises(tf.errors.InvalidArgumentError, match="assertion failed"):
                sess.run("train")


def _vocabulary_lookup(f):
    #   take["id"] -> lookup(table) -> != default -> select(hash_bucket(id) + size(table)) -> cast -> add <- sqrt(x)
    #   table -> size          (reads the read-only table only: not computed from the batch, the same every run)
    init = tf.lookup.KeyValueTensorInitializer(["1", "2"], tf.constant([0, 1], tf.int64))
    table = tf.compat.v1.lookup.StaticVocabularyTable(init, num_oov_buckets=3)
    return tf.sqrt(f["x"]) + tf.cast(table.lookup(f["id"]), tf.float32)


@pytest.mark.parametrize("form", ["initializable", "one_shot"])
def test_a_read_only_tables_size_folds_with_its_lookup(form):
    meta = lookup_graph(form, body=_vocabulary_lookup)
    result = optimized(meta)
    fit = fold_report(result).details["stage"]
    ops = {n.name: n.op for n in meta.graph_def.node}
    assert fit.folds, fit.skipped
    assert [ops[name] for name in fit.body if ops[name] == "LookupTableSizeV2"] == ["LookupTableSizeV2"]
    np.testing.assert_array_equal(run_plain(result.meta_graph_def, ROWS // BATCH), run_flag_off(meta, ROWS // BATCH))


def test_optimizing_the_folded_graph_again_changes_nothing():
    first = optimized(lookup_graph())
    again = optimized(first.meta_graph_def)
    assert not again.changed and again.graph_def == first.graph_def
    assert "already folded into datasets" in again.reports[0].summary[0]


# -- random bodies: whatever mix of stateless ops and lookups moves, the folded steps are the flag-off steps ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_STEPS = {
    "sqrt": lambda x, f, table: tf.sqrt(x),
    "scale": lambda x, f, table: x * 0.5 + 1.0,
    "lookup": lambda x, f, table: x + tf.cast(table.lookup(f["id"]), tf.float32),
    "hash": lambda x, f, table: x + tf.cast(tf.strings.to_hash_bucket_fast(f["id"], 7), tf.float32),
    # Not `/ 100.0`: a session's Grappler turns a division by a constant into a multiplication by its
    # reciprocal in the step (last-ulp different), and does not rewrite tf.data functions (see fold_dataset).
    "square": lambda x, f, table: tf.square(x) / 100.0,
}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=4),
       num_threads=st.sampled_from([1, 2, 4]), capacity=st.sampled_from([1, 4, 40]),
       form=st.sampled_from(["initializable", "one_shot"]))
def test_any_chain_of_movable_ops_folds_with_the_flag_off_values(chain, num_threads, capacity, form):
    #   IteratorGetNext -> put ~~ take -> <chain of sqrt / scale / lookup / hash / square> -> mul(w) -> loss
    def body(f):
        table, x = _table(), f["x"]
        for step in chain:
            x = _STEPS[step](x, f, table)
        return x

    meta = lookup_graph(form, body=body, capacity=capacity, num_threads=num_threads)
    result = optimized(meta)
    assert fold_report(result).details["stage"].folds
    np.testing.assert_array_equal(run_plain(result.meta_graph_def, ROWS // BATCH), run_flag_off(meta, ROWS // BATCH))
