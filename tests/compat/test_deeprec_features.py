"""smartstage.compat's DeepRec API: flag spellings, DeepRec-only features, every config-taking session API, tf.layers."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from smartstage.compat import DeepRecFeatureError
from smartstage.compat import tf as dtf
from smartstage.config import deeprec
from smartstage.config.options import enable_smart_stage, options_from_config, to_session_config
from smartstage.session.record import live_rewrite_of
from tests.bounds import JOB_HANG_SECONDS
from tests.compat.zoo_runner import PORT_FLAGS, load_zoo, write_data

# -- DeepRec-only features: one error naming the script flag that turns them off -------------------------------

SCRIPT_FLAGS = [
    (["--optimizer", "adamasync"], "tf.train.AdamAsyncOptimizer", "--optimizer adam"),
    (["--optimizer", "adagraddecay"], "tf.train.AdagradDecayOptimizer", "--optimizer adagrad"),
    (["--ev", "True"], "categorical_column_with_embedding", "--ev False"),
    (["--ev_elimination", "gstep"], "tf.GlobalStepEvict", "--ev_elimination None"),
    (["--ev_filter", "counter"], "tf.CounterFilter", "--ev_filter None"),
    (["--parquet_dataset", "True"], "ParquetDataset", "--parquet_dataset False"),
    (["--workqueue", "True"], "WorkQueue", "--workqueue False"),
    (["--bf16"], "keep_weights", "without --bf16"),
    # Auto Micro Batch: the script divides --batch_size by N for N summed copies; ignored, it would train on
    # half-size batches, so the session refuses it before the first step.
    (["--micro_batch", "2"], "micro_batch_num=2", "--micro_batch 0"),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return write_data(tmp_path_factory.mktemp("criteo"))


@pytest.mark.parametrize("flags, feature, turn_off", SCRIPT_FLAGS, ids=[f[0][0] for f in SCRIPT_FLAGS])
def test_a_deeprec_only_feature_raises_one_error_naming_the_flag(flags, feature, turn_off, data_dir, tmp_path):
    names = load_zoo("dlrm")
    argv = ["--data_location", data_dir, "--checkpoint", str(tmp_path), *PORT_FLAGS, *flags]
    with tf.Graph().as_default():
        names["main"].__globals__["args"] = names["get_arg_parser"]().parse_args(argv)
        with pytest.raises(DeepRecFeatureError) as error:
            names["main"]()
    assert feature in str(error.value) and turn_off in str(error.value)
    assert "\n" not in str(error.value)


def test_deeprec_names_exist_as_on_deeprec_and_the_option_object_is_inert():
    assert hasattr(dtf.train, "AdamAsyncOptimizer") and hasattr(dtf, "CBFFilter")
    option = dtf.EmbeddingVariableOption(evict_option=None, filter_option=None)  # built even with --ev False
    assert option.evict_option is None
    with pytest.raises(DeepRecFeatureError, match="TensorFlow 2.21 has no Estimator"):
        dtf.estimator.RunConfig(session_config=dtf.ConfigProto())


def test_embedding_column_do_fusion_builds_the_stock_column(graph):
    column = dtf.feature_column.categorical_column_with_hash_bucket("c", 10)
    fused = dtf.feature_column.embedding_column(column, 4, combiner="mean", do_fusion=True)
    stock = tf.compat.v1.feature_column.embedding_column(column, 4, combiner="mean")
    assert fused._replace(initializer=None) == stock._replace(initializer=None)  # each call makes its initializer
    shared = dtf.feature_column.shared_embedding_columns([column], 4, do_fusion="v2")
    assert [c.dimension for c in shared] == [4]


# -- DeepRec-only keywords of stock APIs (compat.keywords) -----------------------------------------------------


def _wide_and_deep_layers(fc, **deeprec):
    """features -> input_layer(embedding, numeric) and linear_model(categorical, numeric); returns the GraphDef."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(3)
        features = {"c": tf.constant([["a"], ["b"], ["a"]]), "n": tf.constant([[1.0], [2.0], [3.0]])}
        category = fc.categorical_column_with_hash_bucket("c", 10)
        number = fc.numeric_column("n")
        deep = fc.input_layer(features, [fc.embedding_column(category, 4, **deeprec), number], **deeprec)
        wide = fc.linear_model(features, [category, number], units=1, sparse_combiner="sum", **deeprec)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            values = sess.run([deep, wide])
        return graph.as_graph_def(), values


@pytest.mark.parametrize("do_fusion", [True, "v2", False, None])
def test_do_fusion_on_input_layer_linear_model_and_embedding_column_builds_the_stock_graph(do_fusion):
    # wide_and_deep's --emb_fusion True passes do_fusion to linear_model: stock TensorFlow raised a TypeError.
    fused, fused_values = _wide_and_deep_layers(dtf.feature_column, do_fusion=do_fusion)
    stock, stock_values = _wide_and_deep_layers(tf.compat.v1.feature_column)
    assert [(n.name, n.op, list(n.input)) for n in fused.node] == [(n.name, n.op, list(n.input)) for n in stock.node]
    for got, expected in zip(fused_values, stock_values):
        np.testing.assert_array_equal(got, expected)


REFUSED_KEYWORDS = [
    (lambda: dtf.feature_column.input_layer({}, [], adaptive_mask_tensors={"c": dtf.ones([2], dtf.int32)}),
     "input_layer(adaptive_mask_tensors=...)", "--adaptive_emb False"),
    (lambda: dtf.train.MonitoredTrainingSession(save_incremental_checkpoint_secs=60),
     "MonitoredTrainingSession(save_incremental_checkpoint_secs=...)", "--incremental_ckpt left out"),
    (lambda: dtf.get_multihash_variable("item", [[10, 4], [10, 4]]), "tf.get_multihash_variable", "--multihash False"),
    (lambda: dtf.config.experimental.enable_distributed_strategy(strategy="collective"),
     "enable_distributed_strategy", "--group_embedding None"),
    (lambda: dtf.distribute.Server(dtf.train.ClusterSpec({"ps": ["localhost:1"]}), job_name="ps", task_index=0,
                                   protocol="star_server"), "Server(protocol='star_server')", "--protocol grpc"),
]


@pytest.mark.parametrize("call, feature, turn_off", REFUSED_KEYWORDS, ids=[r[2].split()[0] for r in REFUSED_KEYWORDS])
def test_a_refused_deeprec_keyword_names_the_flag_that_turns_it_off(graph, call, feature, turn_off):
    with pytest.raises(DeepRecFeatureError) as error:
        call()
    assert feature in str(error.value) and turn_off in str(error.value) and "\n" not in str(error.value)


def test_the_stock_server_protocol_is_the_stock_server():
    assert issubclass(dtf.distribute.Server, tf.compat.v1.distribute.Server) and dtf.train.Server is dtf.distribute.Server
    server = dtf.distribute.Server({"localhost": ["localhost:0"]}, protocol="grpc")  # the scripts' default
    assert server.target.startswith("grpc://")


def test_a_deeprec_keyword_left_at_its_default_is_the_stock_call(graph):
    features = {"n": tf.constant([[1.0]])}
    layer = dtf.feature_column.input_layer(features, [dtf.feature_column.numeric_column("n")],
                                           adaptive_mask_tensors=None)
    assert layer.shape.as_list() == [1, 1]


def test_an_unknown_keyword_is_named_never_a_type_error_from_inside_tensorflow(graph):
    with pytest.raises(DeepRecFeatureError, match=r"linear_model: argument 'fuse_all' is neither stock TensorFlow's "
                                                  r"\(features, feature_columns, units, .*\) nor a DeepRec keyword"):
        dtf.feature_column.linear_model({}, [], fuse_all=True)


# -- DeepRec's flag spellings ----------------------------------------------------------------------------------


def test_deeprec_optimizer_options_are_accepted_and_logged_once(caplog):
    config = dtf.ConfigProto()
    oo = config.graph_options.optimizer_options
    oo.do_smart_stage = True
    oo.do_op_fusion = True
    oo.micro_batch_num = 1  # one copy of the step: only > 1 changes the training (refused, below)
    deeprec._logged_not_applied.clear()  # noqa: SLF001  (once per process: start this test from none)
    with caplog.at_level(logging.WARNING, logger="smartstage.config.deeprec"):
        assert options_from_config(config).do_smart_stage
        options_from_config(config)
    logged = [r.getMessage() for r in caplog.records]
    assert sum("do_op_fusion" in m for m in logged) == 1 and sum("micro_batch_num" in m for m in logged) == 1
    assert to_session_config(config).graph_options.optimizer_options.ByteSize() == 0  # none reaches TensorFlow


@pytest.mark.parametrize("field", ["do_smart_stage_gpu", "stage_subgraph_on_cpu"])
def test_both_spellings_of_the_gpu_flag_turn_gpu_placement_on(field):
    config = dtf.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    setattr(config.graph_options.optimizer_options, field, True)
    options = options_from_config(config)
    assert options.enabled and options.do_smart_stage_gpu


def test_smart_stage_options_turn_auto_stage_on():
    config = dtf.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    config.graph_options.optimizer_options.smart_stage_options.CopyFrom(dtf.SmartStageOptions(capacity=3))
    assert options_from_config(config).auto_stage.capacity == 3


# -- every session API that takes a config ---------------------------------------------------------------------


def _staged_graph():
    """dataset -> staged -> hash -> lookup(variable) -> loss; returns (loss, train_op)."""
    words = tf.compat.v1.data.Dataset.from_tensor_slices(np.array([b"a", b"b", b"c", b"d"] * 8)).batch(2)
    batch = tf.compat.v1.data.make_one_shot_iterator(words).get_next()
    taken = dtf.staged(batch, capacity=2)
    ids = tf.strings.to_hash_bucket_fast(taken, 10)
    table = tf.compat.v1.get_variable("table", [10, 2], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return loss, train_op


def _deeprec_config():
    config = dtf.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    return config


CONFIGS = {"deeprec": _deeprec_config, "stock": lambda: enable_smart_stage(tf.compat.v1.ConfigProto())}
SESSIONS = {
    "ChiefSessionCreator+MonitoredSession": lambda config: dtf.train.MonitoredSession(
        session_creator=dtf.train.ChiefSessionCreator(config=config), hooks=[dtf.make_prefetch_hook()]),
    "stock ChiefSessionCreator+MonitoredSession": lambda config: dtf.train.MonitoredSession(
        session_creator=tf.compat.v1.train.ChiefSessionCreator(config=config), hooks=[dtf.make_prefetch_hook()]),
    "SingularMonitoredSession": lambda config: dtf.train.SingularMonitoredSession(
        config=config, hooks=[dtf.make_prefetch_hook()]),
}


def _losses(make_session, config):
    with tf.Graph().as_default() as graph:
        loss, train_op = _staged_graph()
        with make_session(config) as sess:
            losses = [sess.run([loss, train_op])[0] for _ in range(6)]
        return losses, live_rewrite_of(graph)


@pytest.mark.parametrize("config_kind", CONFIGS)
@pytest.mark.parametrize("session_kind", SESSIONS)
def test_each_monitored_session_api_takes_either_config_and_rewrites_the_graph(config_kind, session_kind):
    losses, record = _losses(SESSIONS[session_kind], CONFIGS[config_kind]())
    reference, unchanged = _losses(SESSIONS[session_kind], dtf.ConfigProto())
    # flag off: nothing expands; a tf.data stage is folded into its dataset (tf_data_stage='fold')
    assert record is not None and record.changed and (unchanged is None or all(s.folded_into for s in unchanged.stages))
    assert losses == reference


def _micro_batch_config(n):
    config = _deeprec_config()
    config.graph_options.optimizer_options.micro_batch_num = n
    return config


MICRO_BATCH_SESSIONS = {
    "MonitoredTrainingSession": lambda config: dtf.train.MonitoredTrainingSession(config=config),
    "ChiefSessionCreator": lambda config: dtf.train.ChiefSessionCreator(config=config),
    "WorkerSessionCreator": lambda config: dtf.train.WorkerSessionCreator(config=config),
    "SingularMonitoredSession": lambda config: dtf.train.SingularMonitoredSession(config=config),
    "Supervisor": lambda config: dtf.train.Supervisor(logdir=None).prepare_or_wait_for_session(config=config),
    # the config layer refuses it too, so no path reads the field and trains on 1/N-size batches
    "compat tf.Session": lambda config: dtf.Session(config=config),
    "options_from_config": lambda config: options_from_config(config),
}


@pytest.mark.parametrize("session_kind", MICRO_BATCH_SESSIONS)
def test_micro_batch_num_above_one_is_refused_before_any_session_starts(session_kind, graph):
    _staged_graph()
    with pytest.raises(DeepRecFeatureError) as error:
        MICRO_BATCH_SESSIONS[session_kind](_micro_batch_config(2))
    message = str(error.value)
    assert message.startswith("ConfigProto.graph_options.optimizer_options.micro_batch_num=2 is DeepRec-only")
    assert "run the script with --micro_batch 0 (leave it out) and the full --batch_size" in message
    assert "\n" not in message
    assert live_rewrite_of(graph) is None  # refused before the rewrite


def test_micro_batch_num_one_is_one_copy_of_the_step_and_trains_as_without_it():
    losses, record = _losses(SESSIONS["SingularMonitoredSession"], _micro_batch_config(1))
    reference, _ = _losses(SESSIONS["SingularMonitoredSession"], _deeprec_config())
    assert record.changed and losses == reference


def test_a_plain_session_creator_rewrites_the_graph(graph):
    loss, _ = _staged_graph()
    creator = dtf.train.WorkerSessionCreator(config=_deeprec_config())
    assert isinstance(creator, tf.compat.v1.train.WorkerSessionCreator)
    creator = dtf.train.ChiefSessionCreator(config=_deeprec_config())
    sess = creator.create_session()
    try:
        assert live_rewrite_of(graph).changed
    finally:
        sess.close()


def test_supervisor_takes_the_deeprec_config_and_rewrites_its_graph(graph, tmp_path):
    loss, train_op = _staged_graph()
    supervisor = dtf.train.Supervisor(logdir=str(tmp_path), save_model_secs=0, save_summaries_secs=0)
    with supervisor.managed_session(config=_deeprec_config()) as sess:
        import smartstage

        with smartstage.start_prefetch_threads(sess, coord=supervisor.coord):
            assert sess.run(loss) == 4.0
    assert live_rewrite_of(graph).changed


# -- tf.layers -------------------------------------------------------------------------------------------------


def test_tf_layers_work_when_the_script_imported_tensorflow_and_keras_first():
    script = (
        "import tensorflow as tf\n"
        "print(tf.keras.__name__)\n"                         # TensorFlow loads Keras 3 first
        "from smartstage.compat import tf as dtf\n"
        "x = dtf.placeholder(dtf.float32, [None, 3])\n"
        "y = dtf.layers.batch_normalization(dtf.layers.dense(x, 4), training=True)\n"
        "loss = dtf.keras.losses.BinaryCrossentropy()(dtf.ones([2]), dtf.ones([2]))\n"
        "print('OK', y.shape, len(dtf.get_collection(dtf.GraphKeys.UPDATE_OPS)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOB_HANG_SECONDS,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", **__import__("os").environ})
    assert "OK (None, 4) 2" in done.stdout, done.stderr[-2000:]


def test_tf_layers_default_kernel_initializer_follows_the_graph_seed():
    def weights():
        with tf.Graph().as_default():
            dtf.set_random_seed(7)
            dtf.layers.dense(dtf.ones([1, 3]), 2, name="d")
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                return sess.run(tf.compat.v1.global_variables()[0])

    np.testing.assert_array_equal(weights(), weights())
