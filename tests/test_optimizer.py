"""optimize(): the rewrite, the pipeline report, config handling, inputs and bad input."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import smartstage as ss
from smartstage.config.deeprec import ConfigProto
from smartstage.config.options import enable_smart_stage
from smartstage.errors import GraphError, NoStageError, TargetError
from smartstage.optimizer import optimize
from tests.builder import G, N, node
from tests.passes.stage_graphs import fifo_stage, reader, two_feature_graph, variable

ON = enable_smart_stage()


def inputs(g, name):
    return list(node(g, name).input)


def test_rewrite_of_two_feature_graph():
    before = two_feature_graph()
    snapshot = before.SerializeToString()
    result = optimize(before, ON)
    g = result.graph_def
    assert before.SerializeToString() == snapshot, "the input must never be mutated"
    assert sorted(n.name for n in g.node) == sorted(n.name for n in before.node), "every node keeps its name"
    assert g.node[-1].name == "stage/put", "the put moves after its new inputs: the GraphDef stays topological"
    assert inputs(g, "stage/put") == ["stage/buffer", "hash", "concat"]
    assert inputs(g, "hash") == ["r0"]
    assert inputs(g, "concat") == ["r1", "xxx", "concat/axis"]
    assert inputs(g, "lookup") == ["w/read", "stage/take", "lookup/axis"]
    assert inputs(g, "as_string") == ["stage/take:1"]
    types = [tf.int64.as_datatype_enum, tf.string.as_datatype_enum]
    assert list(node(g, "stage/put").attr["Tcomponents"].list.type) == types
    assert list(node(g, "stage/take").attr["component_types"].list.type) == types
    assert list(node(g, "stage/buffer").attr["component_types"].list.type) == types
    # fold_dataset runs and changes nothing: the stage reads no tf.data iterator (r0, r1 are reader reads)
    assert result.passes == ["find_stages", "partition", "expand_stage", "fold_dataset"]
    assert [r.changed for r in result.reports] == [False, False, True, False]
    assert result.fetch_map() == {"hash:0": "stage/take:0", "concat:0": "stage/take:1"}


def test_optimize_twice_gives_the_same_graph():
    once = optimize(two_feature_graph(), ON)
    twice = optimize(once.graph_def, ON)
    assert twice.graph_def.SerializeToString(deterministic=True) == once.graph_def.SerializeToString(deterministic=True)
    assert not twice.changed
    again = optimize(two_feature_graph(), ON)
    assert again.graph_def.SerializeToString(deterministic=True) == once.graph_def.SerializeToString(deterministic=True)


def test_control_edges_across_the_cut_are_rerouted_not_dropped():
    #   take -> check(Assert) -^-> loss;  take -> a -> loss
    g = G(reader("r", tf.int64), *fifo_stage(["r"], dtypes=[tf.int64]),
          N("ok", "Const", dtype=tf.bool, value=True),
          N("check", "Assert", ["ok", "stage/take"], T=[tf.int64]),
          *variable("w"), N("wv", "Cast", ["w/read"], SrcT=tf.float32, DstT=tf.int64),
          N("a", "Identity", ["stage/take"], T=tf.int64),
          N("loss", "AddV2", ["a", "wv", "^check"], T=tf.int64), N("out", "Identity", ["loss"], T=tf.int64))
    out = optimize(g, ON).graph_def
    assert inputs(out, "stage/put") == ["stage/buffer", "a", "^check"]
    assert inputs(out, "check") == ["ok", "r"]
    assert inputs(out, "loss") == ["stage/take", "wv"]  # reads the take, so it runs after it


def test_control_edge_on_the_take_of_a_moved_node_becomes_edges_on_the_producers():
    g = G(reader("r", tf.int64), *fifo_stage(["r"], dtypes=[tf.int64]),
          N("c", "Const", ["^stage/take"], dtype=tf.int64, value=3),
          N("a", "AddV2", ["stage/take", "c"], T=tf.int64), *variable("w"),
          N("use", "Cast", ["a"], SrcT=tf.int64, DstT=tf.float32), N("loss", "Mul", ["use", "w/read"], T=tf.float32))
    out = optimize(g, ON).graph_def
    assert inputs(out, "c") == ["^r"]
    assert inputs(out, "a") == ["r", "c"]


def test_empty_cut_leaves_the_stage_and_says_why():
    g = G(reader("r"), *fifo_stage(["r"]), *variable("w"),
          N("axis", "Const", dtype=tf.int32, value=0),
          N("g", "GatherV2", ["w/read", "stage/take", "axis"], Tparams=tf.float32, Tindices=tf.string, Taxis=tf.int32))
    result = optimize(g, ON)
    assert result.graph_def == g
    assert not result.changed
    assert "nothing to move" in result.summary()


def test_flags_off_returns_the_graph_unchanged_and_says_so():
    result = optimize(two_feature_graph(), tf.compat.v1.ConfigProto())
    assert result.graph_def == two_feature_graph()
    assert result.reports == () and "SmartStage is off" in result.summary()


def test_deeprec_spelling_means_the_same():
    config = ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    assert optimize(two_feature_graph(), config).graph_def == optimize(two_feature_graph(), ON).graph_def


def test_no_stage_is_a_clear_error():
    g = G(reader("r"), N("h", "StringToHashBucketFast", ["r"], num_buckets=3))
    with pytest.raises(NoStageError, match="staged"):
        optimize(g, ON)


def test_target_that_names_no_node():
    with pytest.raises(TargetError, match="nope"):
        optimize(two_feature_graph(), ON, targets=["nope:0"])


def test_targets_keep_a_tensor_on_the_main_side():
    result = optimize(two_feature_graph(), ON, targets=["hash:0"])
    assert "hash" not in result.moved()
    assert result.partitions[0].pinned["hash"].kind == "target"


@pytest.mark.parametrize("mutate, message", [
    (lambda g: g.node.append(N("hash", "Identity", ["r0"], T=tf.string)), "duplicate node name 'hash'"),
    (lambda g: g.node.append(N("bad", "Identity", ["ghost:1"], T=tf.string)), "no node 'ghost'"),
    (lambda g: node(g, "hash").input.append("^loss"), "cycle: .*hash.*loss"),
])
def test_bad_graphs_get_errors_that_name_the_node(mutate, message):
    g = two_feature_graph()
    mutate(g)
    with pytest.raises(GraphError, match=message):
        optimize(g, ON)


def test_boundary_tensor_of_unknown_dtype_is_a_clear_error():
    #   r -> mystery (an op this TensorFlow does not know) -> put(r, mystery) ~~ take -> h -> out
    #                                                                       take:1 -> out2
    # h moves, so the buffer is rebuilt, and mystery:0 still crosses: its dtype is needed and cannot be known.
    g = G(reader("r"), N("mystery", "DeepRecOnlyOp", ["r"]), *fifo_stage(["r", "mystery"]),
          N("h", "StringToHashBucketFast", ["stage/take"], num_buckets=3), N("out", "Identity", ["h"], T=tf.int64),
          N("out2", "Identity", ["stage/take:1"], T=tf.string))
    with pytest.raises(GraphError, match=r"stage 'stage': tensor 'mystery:0' must cross the boundary, but its dtype "
                                         r"cannot be known \(node 'mystery' has op type 'DeepRecOnlyOp'.*mark it as a "
                                         r"target .*\[in pass 'expand_stage'"):
        optimize(g, ON)


def test_a_tensor_of_unknown_dtype_that_does_not_cross_is_no_error():
    g = G(reader("r"), *fifo_stage(["r"]), N("mystery", "DeepRecOnlyOp", ["r"]),
          *fifo_stage(["mystery"], name="s2"), N("h", "StringToHashBucketFast", ["stage/take"], num_buckets=3),
          N("out", "Identity", ["h"], T=tf.int64), N("out2", "Identity", ["s2/take"], T=tf.string))
    # 'mystery' only feeds another stage: nothing needs its dtype, so this works.
    assert optimize(g, ON).changed
    g2 = G(reader("r"), N("mystery", "DeepRecOnlyOp", ["r"]), *fifo_stage(["mystery"]),
           N("h", "StringToHashBucketFast", ["stage/take"], num_buckets=3), N("out", "Identity", ["h"], T=tf.int64))
    result = optimize(g2, ON)  # the take's own dtype is known from the buffer: fine
    assert result.changed


@pytest.mark.parametrize("content, message", [
    (b"\x0a\xff\xff\xff", "not a valid binary GraphDef"),
    (b"", "empty"),
])
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "g.pb"
    path.write_bytes(content)
    with pytest.raises(GraphError, match=message):
        optimize(str(path), ON)
    with pytest.raises(GraphError, match="does not exist"):
        optimize(str(tmp_path / "missing.pb"), ON)


def test_all_file_formats_round_trip(tmp_path):
    from smartstage.graph.load import write_graph

    g = two_feature_graph()
    expected = optimize(g, ON).graph_def
    for suffix in (".pb", ".pbtxt"):
        path = tmp_path / f"g{suffix}"
        write_graph(g, path)
        assert optimize(str(path), ON).graph_def == expected


def test_staging_area_pair_is_rebuilt_as_the_same_kind_with_every_op_updated():
    #   r -> Stage(shared "area") ~~ Unstage -> hash -> lookup(w);  StageSize(shared "area")
    s = tf.string
    g = G(reader("r"),
          N("area/put", "Stage", ["r"], dtypes=[s], shared_name="area"),
          N("area/get", "Unstage", [], dtypes=[s], shared_name="area"),
          N("area/size", "StageSize", [], dtypes=[s], shared_name="area"),
          N("hash", "StringToHashBucketFast", ["area/get"], num_buckets=10),
          *variable("w"), N("axis", "Const", dtype=tf.int32, value=0),
          N("g", "GatherV2", ["w/read", "hash", "axis"], Tparams=tf.float32, Tindices=tf.int64, Taxis=tf.int32))
    out = optimize(g, ON).graph_def
    assert inputs(out, "area/put") == ["hash"]
    for name in ("area/put", "area/get", "area/size"):
        assert list(node(out, name).attr["dtypes"].list.type) == [tf.int64.as_datatype_enum]


def test_deeprec_tensor_buffer_graph_is_analysed_offline():
    s = tf.string
    g = G(reader("r"),
          N("tb/put", "TensorBufferPut", ["r"], dtypes=[s], shared_name="tb", capacity=2),
          N("tb/take", "TensorBufferTake", [], dtypes=[s], shared_name="tb"),
          N("tb/close", "TensorBufferClose", [], shared_name="tb"),
          N("hash", "StringToHashBucketFast", ["tb/take"], num_buckets=10),
          *variable("w"), N("axis", "Const", dtype=tf.int32, value=0),
          N("g", "GatherV2", ["w/read", "hash", "axis"], Tparams=tf.float32, Tindices=tf.int64, Taxis=tf.int32))
    result = optimize(g, ON)
    assert result.moved() == {"hash"}
    assert list(node(result.graph_def, "tb/take").attr["dtypes"].list.type) == [tf.int64.as_datatype_enum]


def test_empty_shared_name_stage_pair_is_not_a_stage():
    g = G(reader("r"), N("p", "Stage", ["r"], dtypes=[tf.string]), N("t", "Unstage", [], dtypes=[tf.string]))
    with pytest.raises(NoStageError, match="empty shared_name"):
        optimize(g, ON)


def test_pass_failure_names_the_pass_and_those_before(monkeypatch):
    from smartstage.passes import partition as partition_module

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(partition_module, "partition_stages", boom)
    with pytest.raises(ss.PassError, match=r"pass 'partition' failed after \[find_stages\]: RuntimeError: boom"):
        optimize(two_feature_graph(), ON)


def test_meta_graph_keeps_collections_and_updates_stage_defs():
    from tensorflow.core.protobuf import meta_graph_pb2

    from smartstage.graph.load import STAGES_COLLECTION
    from smartstage.protos import StageDef

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(two_feature_graph())
    sd = StageDef(name="stage", buffer_node="stage/buffer", put_node="stage/put", take_node="stage/take",
                  boundary_tensors=["r0:0", "r1:0"], origin="staged")
    meta.collection_def[STAGES_COLLECTION].bytes_list.value.append(sd.SerializeToString())
    meta.collection_def["train_op"].node_list.value.append("as_string")
    meta.collection_def["my_stuff"].node_list.value.append("w")
    result = optimize(meta, ON)
    assert result.meta_graph_def is not None
    assert "my_stuff" in result.meta_graph_def.collection_def
    (stored,) = result.meta_graph_def.collection_def[STAGES_COLLECTION].bytes_list.value
    assert list(StageDef.FromString(stored).boundary_tensors) == ["hash:0", "concat:0"]
    assert result.partitions[0].pinned["as_string"].kind == "target"
    assert list(StageDef.FromString(meta.collection_def[STAGES_COLLECTION].bytes_list.value[0]).boundary_tensors) \
        == ["r0:0", "r1:0"], "the input MetaGraphDef must not be mutated"


def test_wrong_custom_optimizer_parameter_is_a_config_error():
    config = tf.compat.v1.ConfigProto()
    entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
    entry.parameter_map["do_smart_stag"].b = True
    with pytest.raises(ss.ConfigError, match="do_smart_stag"):
        optimize(two_feature_graph(), config)


_ = graph_pb2


def test_boundary_shapes_come_from_output_shapes_and_are_verified():
    from smartstage.errors import VerificationError
    from smartstage.graph.stages import find_stages
    from smartstage.graph.view import GraphView
    from smartstage.passes.verify import verify_graph

    g = two_feature_graph()
    for n in g.node:
        if n.name in ("hash", "concat"):
            n.attr["_output_shapes"].list.shape.add().dim.add(size=2 if n.name == "hash" else 3)
    out = optimize(g, ON).graph_def
    shapes = node(out, "stage/buffer").attr["shapes"].list.shape
    assert [[d.size for d in s.dim] for s in shapes] == [[2], [3]]
    stages, _ = find_stages(GraphView(out))
    node(out, "hash").attr["_output_shapes"].list.shape[0].dim[0].size = 5
    with pytest.raises(VerificationError, match=r"put input hash:0 has shape \[5\], but the buffer declares \[2\]"):
        verify_graph(out, stages)


def test_the_cycle_collector_is_restored_as_it_was():
    import gc

    assert gc.isenabled()
    optimize(two_feature_graph(), ON)
    assert gc.isenabled()
    with pytest.raises(NoStageError):
        optimize(G(reader("r", tf.int64)), ON)
    assert gc.isenabled(), "restored after an error too"
    gc.disable()
    try:
        optimize(two_feature_graph(), ON)
        assert not gc.isenabled(), "a caller's choice to keep it off is kept"
    finally:
        gc.enable()


@pytest.mark.parametrize("flags", [ON, None], ids=["flag", "no flag"])
def test_the_result_never_aliases_the_input(flags):
    """The input is read, not copied; what the result hands back is a graph of its own, changed or not."""
    before = two_feature_graph()
    done = optimize(two_feature_graph(), ON).graph_def  # optimized already: a second run changes nothing
    for graph in (before, done):
        result = optimize(graph, flags)
        assert graph is before or not result.changed
        assert result.graph_def is not graph
        result.graph_def.node[0].name = "edited"
        assert graph.node[0].name != "edited"
    meta = tf.compat.v1.MetaGraphDef()
    meta.graph_def.CopyFrom(two_feature_graph())
    result = optimize(meta, flags)
    assert result.meta_graph_def is not meta and result.graph_def is not meta.graph_def
    result.graph_def.node[0].name = "edited"
    assert meta.graph_def.node[0].name != "edited"
