"""The tfdata_service pass on small hand-built graphs (no service needed: the graph is built, not run)."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import data_service_pb2

import smartstage as ss
from smartstage.errors import ConfigError

ADDRESS = "grpc://localhost:5050"
SCOPE = "stage/tfdata_service/"


def source(one_shot: bool = False):
    ds = tf.data.Dataset.range(12).map(
        lambda i: {"row": i, "x": tf.cast(i, tf.float32), "name": tf.strings.as_string(i)})
    ds = ds.batch(3)
    if one_shot:
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    return tf.compat.v1.data.make_initializable_iterator(ds).get_next()


def sqrt_graph(body=lambda f: {"row": f["row"], "x": tf.sqrt(f["x"]) + 1.0}, one_shot: bool = False):
    #   range -> map -> batch => MakeIterator/IteratorV2 -> IteratorGetNext -> sqrt -> add(1) -> put ~~ take -> out_*
    #                                                               \-> row ----------------------/
    graph = tf.Graph()
    with graph.as_default():
        f = ss.staged(body(source(one_shot)), capacity=2, num_threads=1)
        for key, tensor in sorted(f.items()):
            tf.identity(tensor, name=f"out_{key}")
        return tf.compat.v1.train.export_meta_graph(graph=graph), [f"out_{k}" for k in sorted(f)]


def optimized(meta, targets, **options):
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_mode="tf_data_service",
                                   tf_data_service=options.pop("address", ADDRESS))
    result = ss.optimize(meta, config, targets=targets, **options)
    (report,) = [r for r in result.reports if r.name == "tfdata_service"]
    return result, report


def test_the_body_becomes_the_datasets_map_and_the_put_reads_the_service_iterator():
    result, report = optimized(*sqrt_graph())
    assert report.changed and report.details["stage"].body == ("Sqrt", "add/y", "add")
    nodes = {n.name: n for n in result.graph_def.node}
    functions = {f.signature.name: f for f in result.graph_def.library.function}
    folded = nodes[SCOPE + "MapDataset"]
    assert folded.input == ["BatchDatasetV2"]
    assert {"Sqrt", "AddV2"} <= {n.op for n in functions[folded.attr["f"].func.name].node_def}
    assert not {"Sqrt", "AddV2", "IteratorGetNext"} & set(nodes)  # the body and the old read are gone
    served = nodes[SCOPE + "DataServiceDatasetV4"]
    mode = data_service_pb2.ProcessingModeDef.FromString(
        nodes[served.input[1]].attr["value"].tensor.string_val[0])
    assert mode.sharding_policy == data_service_pb2.ProcessingModeDef.DYNAMIC
    assert nodes[served.input[2]].attr["value"].tensor.string_val == [b"localhost:5050"]
    assert nodes[SCOPE + "MakeIterator"].input == [SCOPE + "DataServiceDatasetV4", SCOPE + "IteratorV2"]
    assert nodes["MakeIterator"].input[-1] == f"^{SCOPE}MakeIterator"  # the user's initializer starts it
    put = nodes["stage/put"]
    assert put.input[1:] == [f"{SCOPE}IteratorGetNext:{k}" for k in range(len(put.input) - 1)]
    assert all(name.startswith("stage_tfdata_service_fn_") or name.startswith("__inference_Dataset_map_lambda")
               for name in functions)
    with tf.Graph().as_default():  # the result imports: every input resolves, every function exists
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)


def test_optimizing_again_changes_nothing_and_the_names_do_not_depend_on_the_process():
    meta, targets = sqrt_graph()
    first, _ = optimized(meta, targets)
    second, _ = optimized(meta, targets)  # TensorFlow numbered the scratch functions differently this time
    assert first.graph_def == second.graph_def
    again, report = optimized(first.meta_graph_def, targets)
    assert not report.changed and "already distributed" in report.summary[0]
    assert again.graph_def == first.graph_def


def test_a_constant_the_main_side_reads_too_runs_in_the_map_and_stays_for_the_main_side():
    #   IteratorGetNext -> mul(scale) -> put ~~ take -> out_x
    #   scale -----------/   \-> mul(w) -> out_w     (main side: reads the variable w)
    graph = tf.Graph()
    with graph.as_default():
        scale = tf.constant(2.0, name="scale")
        f = ss.staged({"x": source()["x"] * scale}, capacity=2, num_threads=1)
        tf.identity(f["x"], name="out_x")
        tf.identity(tf.Variable(1.0, name="w") * scale, name="out_w")
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    result, report = optimized(meta, ["out_x", "out_w"])
    nodes = {n.name: n for n in result.graph_def.node}
    assert report.changed and report.details["stage"].kept == ("scale",)
    assert "scale" in nodes and "mul" not in nodes and "scale" in nodes["mul_1"].input


def _lookup(f):
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(["1", "2"], [1, 2], value_dtype=tf.int64), 0)
    return {"row": f["row"], "id": table.lookup(f["name"])}


def _py_func(f):
    return {"row": f["row"], "x": tf.compat.v1.py_func(lambda x: x * 2, [f["x"]], tf.float32, stateful=False)}


@pytest.mark.parametrize("body, one_shot, named", [
    (_lookup, False, "LookupTableFindV2"),
    (_py_func, False, "PyFuncStateless"),
    (lambda f: {"x": f["x"] + tf.random.uniform([3])}, False, "RandomUniform"),
    (lambda f: {"x": tf.sqrt(f["x"])}, True, "OneShotIterator"),
])
def test_a_stage_that_does_not_fit_is_left_as_it_was_with_the_node_named(body, one_shot, named):
    meta, targets = sqrt_graph(body, one_shot)
    result, report = optimized(meta, targets)
    assert not report.changed
    (line,) = report.summary
    assert line.startswith("stage: left as it was: ") and named in line, line
    assert not any(n.name.startswith(SCOPE) for n in result.graph_def.node)


def test_options_both_spellings_and_clear_errors():
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_mode="tf_data_service",
                                   tf_data_service="localhost:5050")
    options = ss.options_from_config(config)
    assert (options.input_mode, options.tf_data_service, options.input_job) == ("tf_data_service", ADDRESS, None)
    assert ss.options_from_config(None, input_mode="tf_data_service", tf_data_service=ADDRESS).tf_data_service == ADDRESS
    with pytest.raises(ConfigError, match="needs the dispatcher's address: pass tf_data_service="):
        ss.options_from_config(None, input_mode="tf_data_service")
    with pytest.raises(ConfigError, match="input_mode is 'central'; pass input_mode='tf_data_service'"):
        ss.options_from_config(None, tf_data_service=ADDRESS)
    with pytest.raises(ConfigError, match="not a dispatcher address"):
        ss.options_from_config(None, input_mode="tf_data_service", tf_data_service="http://x/y")
    with pytest.raises(ConfigError, match="drop input_job"):
        ss.options_from_config(None, input_mode="tf_data_service", tf_data_service=ADDRESS, input_job="input",
                               input_tasks=2)
    with pytest.raises(ConfigError, match="tf_data_service has no DeepRec spelling"):
        ss.enable_smart_stage(ss.ConfigProto(), input_mode="tf_data_service", tf_data_service=ADDRESS)
    config.graph_options.rewrite_options.custom_optimizers[0].parameter_map["tf_data_service"].i = 3
    with pytest.raises(ConfigError, match="'tf_data_service' must be a string"):
        ss.options_from_config(config)
