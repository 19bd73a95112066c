"""One spelling per option: the current spelling works silently, the old one works, warns once (FutureWarning
naming the new spelling) and means the same; DeepRec's names are current spellings and never warn; one
default step count for every verify; AutoStageOptions' pool takes what staged() takes and records it alike.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.cli.main import _parser
from smartstage.compat import tf as deeprec_tf

ADDRESS = "grpc://localhost:5050"


def _silently(call):
    """call() with every warning an error: the current spellings warn nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


def _warns_once(call, old: str, new: str):
    """call()'s result; exactly one FutureWarning, naming `old` and `new`, pointing at this file."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(future) == 1, [str(w.message) for w in caught]
    message = str(future[0].message)
    assert old in message and f"use {new}" in message, message
    assert future[0].filename == __file__, future[0].filename  # the user's line, not ours
    return result


# (old keywords, new keywords): enable_smart_stage() with either gives the same ConfigProto
ENABLE_SPELLINGS = [
    ({"gpu": True}, {"do_smart_stage_gpu": True}, "gpu=", "do_smart_stage_gpu="),
    ({"multi_stream": True}, {"stage_multi_stream": True}, "multi_stream=", "stage_multi_stream="),
    ({"input_mode": "tf_data_service", "tfdata_service": ADDRESS},
     {"input_mode": "tf_data_service", "tf_data_service": ADDRESS}, "tfdata_service=", "tf_data_service="),
    ({"input_mode": "tfdata_service", "tf_data_service": ADDRESS},
     {"input_mode": "tf_data_service", "tf_data_service": ADDRESS}, "input_mode='tfdata_service'",
     "input_mode='tf_data_service'"),
]


@pytest.mark.parametrize("old, new, old_text, new_text", ENABLE_SPELLINGS)
def test_enable_smart_stage_takes_both_spellings_and_warns_for_the_old_one(old, new, old_text, new_text):
    current = _silently(lambda: ss.enable_smart_stage(tf.compat.v1.ConfigProto(), **new))
    deprecated = _warns_once(lambda: ss.enable_smart_stage(tf.compat.v1.ConfigProto(), **old), old_text, new_text)
    assert deprecated == current
    assert _silently(lambda: ss.options_from_config(deprecated)) == ss.options_from_config(current)


def test_the_flags_read_back_under_their_current_names():
    config = _silently(lambda: ss.enable_smart_stage(do_smart_stage_gpu=True, stage_multi_stream=True))
    options = _silently(lambda: ss.options_from_config(config))
    assert (options.do_smart_stage, options.do_smart_stage_gpu, options.stage_multi_stream) == (True, True, True)
    service = ss.enable_smart_stage(input_mode="tf_data_service", tf_data_service="localhost:5050")
    options = _silently(lambda: ss.options_from_config(service))
    assert (options.input_mode, options.tf_data_service) == ("tf_data_service", ADDRESS)


def test_both_spellings_of_one_option_are_refused():
    with pytest.raises(ss.ConfigError, match=r"gpu= and do_smart_stage_gpu= are one option given twice"):
        ss.enable_smart_stage(gpu=True, do_smart_stage_gpu=True)
    with pytest.raises(ss.ConfigError, match=r"tfdata_service= and tf_data_service= are one option given twice"):
        ss.SmartStageOptions(tfdata_service=ADDRESS, tf_data_service=ADDRESS)


def test_an_unknown_keyword_of_enable_smart_stage_is_named():
    with pytest.raises(ss.ConfigError, match=r"takes no argument 'gpus'.*'do_smart_stage_gpu'"):
        ss.enable_smart_stage(gpus=True)


def test_the_options_take_the_old_service_spelling_everywhere_they_take_options():
    new = ss.SmartStageOptions(input_mode="tf_data_service", tf_data_service=ADDRESS)
    assert _warns_once(lambda: ss.SmartStageOptions(input_mode="tf_data_service", tfdata_service=ADDRESS),
                       "tfdata_service=", "tf_data_service=") == new
    assert _warns_once(lambda: new.tfdata_service, "tfdata_service", "tf_data_service") == ADDRESS
    from_config = ss.options_from_config(None, input_mode="tf_data_service", tf_data_service=ADDRESS)
    assert _warns_once(lambda: ss.options_from_config(None, input_mode="tf_data_service", tfdata_service=ADDRESS),
                       "tfdata_service=", "tf_data_service=") == from_config
    # the custom_optimizers entry written by hand, with the old key
    config = tf.compat.v1.ConfigProto()
    entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
    entry.parameter_map["do_smart_stage"].b = True
    entry.parameter_map["input_mode"].s = b"tf_data_service"
    entry.parameter_map["tfdata_service"].s = ADDRESS.encode()
    options = _warns_once(lambda: ss.options_from_config(config), "tfdata_service=", "tf_data_service=")
    assert options.tf_data_service == ADDRESS


def test_the_threads_per_input_task_take_their_old_spelling_everywhere_they_take_options():
    # input_num_threads_per_task: num_threads, as staged() and DeepRec spell a thread count
    new = _silently(lambda: ss.SmartStageOptions(input_job="input", input_num_threads_per_task=3))
    assert _warns_once(lambda: ss.SmartStageOptions(input_job="input", input_lanes_per_task=3),
                       "input_lanes_per_task=", "input_num_threads_per_task=") == new
    assert _warns_once(lambda: new.input_lanes_per_task, "input_lanes_per_task", "input_num_threads_per_task") == 3
    with pytest.raises(ss.ConfigError, match=r"input_lanes_per_task= and input_num_threads_per_task= are one option "
                                             r"given twice; pass input_num_threads_per_task= only"):
        ss.SmartStageOptions(input_lanes_per_task=3, input_num_threads_per_task=3)
    from_config = ss.options_from_config(None, input_job="input", input_tasks=2, input_num_threads_per_task=3)
    assert _warns_once(lambda: ss.options_from_config(None, input_job="input", input_tasks=2, input_lanes_per_task=3),
                       "input_lanes_per_task=", "input_num_threads_per_task=") == from_config
    # the custom_optimizers entry: the new key, and the old one written by hand
    for key, warns in (("input_num_threads_per_task", False), ("input_lanes_per_task", True)):
        config = ss.enable_smart_stage(input_job="input", input_tasks=2)
        config.graph_options.rewrite_options.custom_optimizers[0].parameter_map[key].i = 3
        read = (lambda: ss.options_from_config(config))
        options = _warns_once(read, f"{key}=", "input_num_threads_per_task=") if warns else _silently(read)
        assert (options.input_job, options.input_tasks, options.input_num_threads_per_task) == ("input", 2, 3)


def test_optimize_takes_the_old_threads_per_task_spelling_as_an_override():
    with pytest.raises(ss.ConfigError, match=r"input_num_threads_per_task and input_timeout_millis must be positive"), \
            pytest.warns(FutureWarning, match="use input_num_threads_per_task="):
        ss.optimize(tf.compat.v1.GraphDef(), ss.enable_smart_stage(input_job="input", input_tasks=2),
                    input_lanes_per_task=0)


def _pipeline_report(**fields):
    from smartstage.runtime.hooks.pipeline_hook import PipelineReport

    base = dict(stage="stage", step=10, steps=10, steps_per_second=40.0, step_ms=25.0, consumer_wait_ms=3.0,
                occupancy=None, last_occupancy=None, capacity=4, producer_ms=0.0, producer_wait_ms=0.0,
                batches_per_second=40.0, ordered=True, own_pool=False, autotuned=(), max_buffered_bytes=0,
                verdict="balanced", line="")
    return PipelineReport(**base, **fields)


def test_the_pipeline_report_names_its_thread_count_num_threads():
    report = _silently(lambda: _pipeline_report(num_threads=2))
    assert report.num_threads == 2
    assert _warns_once(lambda: report.lanes, "lanes", "num_threads") == 2
    assert _warns_once(lambda: _pipeline_report(lanes=2), "lanes=", "num_threads=") == report
    with pytest.raises(ss.ConfigError, match=r"PipelineReport\(\): lanes= and num_threads= are one option given twice"):
        _pipeline_report(lanes=2, num_threads=2)


def test_the_placement_names_its_threads_per_task_num_threads_per_task():
    from smartstage.inspection.placement import StagePlacement

    fields = dict(stage="stage", mode="central", job="input", trainer="", timeout_millis=60000, tasks=(),
                  head=(), stage_ops=(), to_tasks=(), from_tasks=())
    placement = _silently(lambda: StagePlacement(num_threads_per_task=2, **fields))
    assert _warns_once(lambda: placement.lanes_per_task, "lanes_per_task", "num_threads_per_task") == 2
    assert _warns_once(lambda: StagePlacement(lanes_per_task=2, **fields), "lanes_per_task=",
                       "num_threads_per_task=") == placement
    with pytest.raises(ss.ConfigError, match=r"lanes_per_task= and num_threads_per_task= are one option given twice"):
        StagePlacement(lanes_per_task=2, num_threads_per_task=2, **fields)
    # the JSON form writes both keys (schema version 1 keeps its first one) and reads either
    document = placement.to_dict()
    assert document["num_threads_per_task"] == document["lanes_per_task"] == 2
    del document["num_threads_per_task"]
    assert _silently(lambda: StagePlacement.from_dict(document)) == placement


def test_optimize_takes_the_old_service_spelling_as_an_override():
    # a graph with a stage: the override reaches the options (their check refuses a bad address either way)
    with pytest.raises(ss.ConfigError, match=r"tf_data_service='http://x/y' is not a dispatcher address"), \
            pytest.warns(FutureWarning, match="use tf_data_service="):
        ss.optimize(tf.compat.v1.GraphDef(), ss.enable_smart_stage(), input_mode="tf_data_service",
                    tfdata_service="http://x/y")


def test_deeprec_names_are_current_and_never_warn():
    def deeprec_config():
        config = deeprec_tf.ConfigProto()
        oo = config.graph_options.optimizer_options
        oo.do_smart_stage = True
        oo.do_smart_stage_gpu = True
        oo.stage_multi_stream = True
        oo.smart_stage_options.CopyFrom(deeprec_tf.SmartStageOptions(capacity=8, num_threads=2))
        return config

    deeprec = _silently(lambda: ss.options_from_config(deeprec_config()))
    stock = _silently(lambda: ss.options_from_config(ss.enable_smart_stage(
        do_smart_stage_gpu=True, stage_multi_stream=True, auto_stage=ss.AutoStageOptions(capacity=8, num_threads=2))))
    assert (deeprec.do_smart_stage_gpu, deeprec.stage_multi_stream) == (True, True)
    assert deeprec.auto_stage == stock.auto_stage
    # the custom_optimizers keys are DeepRec's field names
    config = ss.enable_smart_stage(do_smart_stage_gpu=True, stage_multi_stream=True)
    stock_params = config.graph_options.rewrite_options.custom_optimizers[0].parameter_map
    assert {"do_smart_stage", "do_smart_stage_gpu", "stage_multi_stream"} <= set(stock_params)


def test_one_default_step_count_for_every_verify():
    defaults = {
        "ss.verify_rewrite": inspect.signature(ss.verify_rewrite).parameters["steps"].default,
        "ss.tf2.verify": inspect.signature(ss.tf2.verify).parameters["steps"].default,
        "ss.tf2.verify_fit": inspect.signature(ss.tf2.verify_fit).parameters["steps"].default,
        "smartstage verify": _parser().parse_args(["verify", "model.meta"]).steps,
    }
    assert set(defaults.values()) == {20}, defaults


# (use_stage_subgraph_thread_pool, stage_subgraph_thread_pool_id): what staged() records for them
POOLS = [
    ((), (False, ss.AUTOTUNE)),                          # the defaults: tuned
    ((ss.AUTOTUNE, 0), (False, ss.AUTOTUNE)),
    ((ss.AUTOTUNE, 2), (False, ss.AUTOTUNE)),
    ((True, 1), (True, 1)),                              # pinned to pool 1
    ((True, 0), (True, 0)),
    ((True, ss.AUTOTUNE), (False, ss.AUTOTUNE)),         # an index of AUTOTUNE: tuned
    ((False, 0), (False, 0)),                            # the session's shared pool
    ((False, ss.AUTOTUNE), (False, ss.AUTOTUNE)),
]


def _staged_pool(arguments) -> tuple:
    graph = tf.Graph()
    with graph.as_default():
        keywords = dict(zip(("use_stage_subgraph_thread_pool", "stage_subgraph_thread_pool_id"), arguments))
        ss.staged(tf.constant([1.0]), **keywords)
    (stage_def,) = ss.stage_defs(graph)
    return stage_def.use_stage_subgraph_thread_pool, stage_def.stage_subgraph_thread_pool_id


def _auto_stage_pool(arguments, config) -> tuple:
    #   one_shot -> next -> mul(w) -> loss -> train     (auto-stage puts its stage at `next`)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(8).batch(2)).get_next(name="next")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(tf.cast(x, tf.float32) * w, name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    keywords = dict(zip(("use_stage_subgraph_thread_pool", "stage_subgraph_thread_pool_id"), arguments))
    options = ss.AutoStageOptions(**keywords)
    # lanes: a folded stage leaves no StageDef to read
    result = ss.optimize(meta, ss.enable_smart_stage(config, auto_stage=options), tf_data_stage="lanes")
    (stage_def,) = ss.stage_defs_from_meta_graph(result.meta_graph_def)
    return stage_def.use_stage_subgraph_thread_pool, stage_def.stage_subgraph_thread_pool_id


@pytest.mark.parametrize("arguments, recorded", POOLS)
def test_auto_stage_takes_the_pool_as_staged_does(arguments, recorded):
    assert _staged_pool(arguments) == recorded
    assert _auto_stage_pool(arguments, tf.compat.v1.ConfigProto()) == recorded
    assert _auto_stage_pool(arguments, deeprec_tf.ConfigProto()) == recorded  # DeepRec's spelling: the same


def test_auto_stage_refuses_a_pool_setting_staged_refuses():
    with pytest.raises(ss.ConfigError, match=r"use_stage_subgraph_thread_pool=2; pass True, False or"):
        ss.AutoStageOptions(use_stage_subgraph_thread_pool=2)
    with pytest.raises(ss.ConfigError, match=r"use_stage_subgraph_thread_pool=2; pass True, False or"):
        ss.staged(tf.constant([1.0]), use_stage_subgraph_thread_pool=2)
