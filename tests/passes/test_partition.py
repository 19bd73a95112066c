"""The partition rules, each on a small hand-drawn graph with the expected verdict written out."""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.graph.view import GraphView
from smartstage.graph.stages import find_stages
from smartstage.passes.partition import partition_stages
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage, gather, reader, two_feature_graph, variable


def partition(graph_def, targets=(), feeds=()):
    view = GraphView(graph_def)
    stages, _ = find_stages(view)
    return partition_stages(view, stages, set(targets), set(feeds))


def test_two_feature_graph_moves_hash_and_concat_and_pins_the_lookup():
    (p,) = partition(two_feature_graph())
    assert p.moved == ("hash", "concat")
    assert p.pinned["lookup"].kind == "variable" and p.pinned["lookup"].cause == "w"
    assert p.pinned["loss"].via == "lookup"
    assert p.pinned["as_string"].kind == "fetched_directly"
    assert p.boundary_before == ("r0:0", "r1:0")
    assert p.boundary_after == ("hash:0", "concat:0")
    assert not p.skipped


def test_fetched_directly_leaf_stays_and_its_input_crosses():
    #   r -> put ~~ take -> hash (nothing consumes it)
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=5))
    (p,) = partition(g)
    assert p.moved == ()
    assert p.pinned["hash"].kind == "fetched_directly"
    assert p.skipped.startswith("nothing to move")


@pytest.mark.parametrize("var_nodes, read_input, kind", [
    ([N("v", "VariableV2", dtype=tf.float32, shape=[10, 4])], "v", "variable"),
    ([N("v", "VarHandleOp", dtype=tf.float32, shape=[10, 4], shared_name="v"),
      N("v/read", "ReadVariableOp", ["v"], dtype=tf.float32)], "v/read", "variable"),
])
def test_every_kind_of_variable_pins_its_readers(var_nodes, read_input, kind):
    #   r -> put ~~ take -> hash -> gather(var) -> out -> sink
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          *var_nodes, *gather("g", read_input, "hash"),
          N("out", "Identity", ["g"], T=tf.float32), N("sink", "Identity", ["out"], T=tf.float32))
    (p,) = partition(g)
    assert p.moved == ("hash",)
    assert p.pinned["g"].kind == kind
    assert p.pinned["sink"].cause == p.pinned["g"].cause


def test_resource_gather_inherits_from_the_handle():
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          N("v", "VarHandleOp", dtype=tf.float32, shape=[10, 4], shared_name="v"),
          N("g", "ResourceGather", ["v", "hash"], dtype=tf.float32, Tindices=tf.int64),
          N("out", "Identity", ["g"], T=tf.float32))
    (p,) = partition(g)
    assert p.pinned["g"].cause == "v" and p.pinned["g"].via == "v"


@pytest.mark.parametrize("op", ["Placeholder", "PlaceholderWithDefault"])
def test_feeds_pin(op):
    #   r -> put ~~ take -> hash -> add(feed) -> out
    inputs = ["dflt"] if op == "PlaceholderWithDefault" else []
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          N("dflt", "Const", dtype=tf.int64, value=1),
          N("feed", op, inputs, dtype=tf.int64, shape=[]),
          N("add", "AddV2", ["hash", "feed"], T=tf.int64), N("out", "Identity", ["add"], T=tf.int64))
    (p,) = partition(g)
    assert p.moved == ("hash",)
    assert p.pinned["add"].kind == "feed" and p.pinned["add"].cause == "feed"


def test_a_named_feed_pins_even_when_it_is_not_a_placeholder():
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          N("one", "Const", dtype=tf.int64, value=1),
          N("add", "AddV2", ["hash", "one"], T=tf.int64), N("out", "Identity", ["add"], T=tf.int64))
    (p,) = partition(g, feeds={"one"})
    assert p.pinned["add"].kind == "feed" and p.pinned["add"].cause == "one"
    (q,) = partition(g)
    assert "add" in q.moved


def test_targets_pin_and_their_inputs_cross():
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          N("t", "Identity", ["hash"], T=tf.int64), N("after", "Identity", ["t"], T=tf.int64))
    (p,) = partition(g, targets={"t"})
    assert p.moved == ("hash",)
    assert p.pinned["t"].kind == "target"
    assert p.pinned["after"].cause == "t"
    assert p.boundary_after == ("hash:0",)


def test_control_flow_pins():
    g = G(reader("r"), *fifo_stage(["r"]), N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
          N("pred", "Const", dtype=tf.bool, value=True),
          N("sw", "Switch", ["hash", "pred"], T=tf.int64), N("out", "Identity", ["sw:1"], T=tf.int64))
    (p,) = partition(g)
    assert p.pinned["sw"].kind == "control_flow"
    assert p.pinned["out"].via == "sw"


def test_mutable_hash_table_pins_and_read_only_table_moves():
    #   take -> find(mutable) -> out      and      take -> find(static) -> out2
    g = G(reader("r"), *fifo_stage(["r"]),
          N("mt", "MutableHashTableV2", key_dtype=tf.string, value_dtype=tf.int64, shared_name="mt"),
          N("st", "HashTableV2", key_dtype=tf.string, value_dtype=tf.int64, shared_name="st"),
          N("dflt", "Const", dtype=tf.int64, value=-1),
          N("find_m", "LookupTableFindV2", ["mt", "stage/take", "dflt"], Tin=tf.string, Tout=tf.int64),
          N("find_s", "LookupTableFindV2", ["st", "stage/take", "dflt"], Tin=tf.string, Tout=tf.int64),
          N("out", "Identity", ["find_m"], T=tf.int64), N("out2", "Identity", ["find_s"], T=tf.int64),
          N("sink", "AddV2", ["out", "out2"], T=tf.int64), N("fetch", "Identity", ["sink"], T=tf.int64))
    (p,) = partition(g)
    assert "find_s" in p.moved and "out2" in p.moved
    assert p.pinned["find_m"].kind == "mutable_state" and p.pinned["find_m"].cause == "mt"


def test_other_input_op_is_a_barrier():
    #   take -> add <- dequeue_many(other queue)
    g = G(reader("r"), *fifo_stage(["r"], dtypes=[tf.int64]),
          N("q2", "FIFOQueueV2", component_types=[tf.int64], capacity=10),
          N("n", "Const", dtype=tf.int32, value=2),
          N("deq", "QueueDequeueManyV2", ["q2", "n"], component_types=[tf.int64]),
          N("add", "AddV2", ["stage/take", "deq"], T=tf.int64), N("out", "Identity", ["add"], T=tf.int64))
    (p,) = partition(g)
    assert p.pinned["add"].kind == "input_op" and p.pinned["add"].cause == "deq"


def test_main_side_control_edge_pins_and_prefetch_control_edge_is_rerouted():
    #   take -> check(Assert) -^-> loss      take -> a(Square) -> loss;   init -^-> b
    g = G(reader("r", tf.int64), *fifo_stage(["r"], dtypes=[tf.int64]),
          N("ok", "Const", dtype=tf.bool, value=True),
          N("check", "Assert", ["ok", "stage/take"], T=[tf.int64], summarize=3),
          N("a", "Square", ["stage/take"], T=tf.int64),
          *variable("w"),
          N("init", "Assign", ["w", "w/read"], T=tf.float32),
          N("b", "Identity", ["stage/take", "^init"], T=tf.int64),
          N("loss", "AddV2", ["a", "b", "^check"], T=tf.int64), N("out", "Identity", ["loss"], T=tf.int64))
    (p,) = partition(g)
    assert set(p.moved) == {"check", "a"}
    assert p.pinned["b"].kind == "variable" and p.pinned["b"].via == "init"
    assert p.control_reroutes == (("check", "loss"),)


def test_random_op_with_free_inputs_moves_with_its_consumer_and_crosses_to_its_other_users():
    #   rand(const shape) -> mul(take) ... and rand -> other (main side): rand runs once, on the prefetch side
    g = G(reader("r", tf.float32), *fifo_stage(["r"], dtypes=[tf.float32]),
          N("shape", "Const", dtype=tf.int32, value=[2]),
          N("rand", "RandomUniform", ["shape"], T=tf.int32, dtype=tf.float32, seed=1, seed2=2),
          N("other", "Identity", ["rand"], T=tf.float32),
          N("mul", "Mul", ["stage/take", "rand"], T=tf.float32), *variable("w"),
          N("out", "AddV2", ["mul", "other"], T=tf.float32), N("fetch", "Mul", ["out", "w/read"], T=tf.float32))
    (p,) = partition(g)
    assert set(p.moved) == {"rand", "mul", "other", "out"}
    assert p.boundary_after == ("out:0",)


def test_random_op_of_main_side_state_blocks_moving_its_consumer():
    #   rand(shape of w) runs on the main side: mul(take, rand) must stay, or rand would run on both sides
    g = G(reader("r", tf.float32), *fifo_stage(["r"], dtypes=[tf.float32]), *variable("w"),
          N("shape", "Shape", ["w/read"], T=tf.float32, out_type=tf.int32),
          N("rand", "RandomUniform", ["shape"], T=tf.int32, dtype=tf.float32, seed=1, seed2=2),
          N("mul", "Mul", ["stage/take", "rand"], T=tf.float32), N("fetch", "Identity", ["mul"], T=tf.float32))
    (p,) = partition(g)
    assert p.pinned["mul"].kind == "variable" and p.pinned["mul"].via == "rand"


def test_a_random_op_is_pulled_behind_one_stage_only():
    #   rand(const) -> m1(s1.take), m2(s2.take)
    g = G(reader("r1", tf.float32), reader("r2", tf.float32),
          *fifo_stage(["r1"], "s1", dtypes=[tf.float32]), *fifo_stage(["r2"], "s2", dtypes=[tf.float32]),
          N("shape", "Const", dtype=tf.int32, value=[2]),
          N("rand", "RandomUniform", ["shape"], T=tf.int32, dtype=tf.float32, seed=1, seed2=2),
          N("m1", "Mul", ["s1/take", "rand"], T=tf.float32), N("m2", "Mul", ["s2/take", "rand"], T=tf.float32),
          N("out", "AddV2", ["m1", "m2"], T=tf.float32), N("fetch", "Identity", ["out"], T=tf.float32))
    p1, p2 = partition(g)
    assert "rand" in p1.moved and "rand" not in p2.moved
    assert p2.pinned["m2"].cause == "rand"


def test_random_op_downstream_of_the_take_moves():
    g = G(reader("r", tf.float32), *fifo_stage(["r"], dtypes=[tf.float32]),
          N("shape", "Shape", ["stage/take"], T=tf.float32, out_type=tf.int32),
          N("rand", "RandomUniform", ["shape"], T=tf.int32, dtype=tf.float32, seed=1, seed2=2),
          N("mul", "Mul", ["stage/take", "rand"], T=tf.float32),
          *variable("w"), N("use", "Mul", ["mul", "w/read"], T=tf.float32))
    (p,) = partition(g)
    assert set(p.moved) == {"shape", "rand", "mul"}
    assert p.boundary_after == ("mul:0",)


def test_unknown_op_type_pins_with_its_type_named():
    g = G(reader("r"), *fifo_stage(["r"]), N("weird", "KvResourceGather", ["stage/take"], dtype=tf.float32),
          N("out", "Identity", ["weird"], T=tf.float32))
    (p,) = partition(g)
    assert p.pinned["weird"].kind == "unknown_op" and "KvResourceGather" in p.pinned["weird"].detail


def test_empty_cut_when_every_consumer_is_pinned():
    g = G(reader("r"), *fifo_stage(["r"]), *variable("w"), *gather("g", "w/read", "stage/take", tf.string),
          N("out", "Identity", ["g"], T=tf.float32))
    (p,) = partition(g)
    assert p.moved == () and "nothing to move" in p.skipped and "'g'" in p.skipped


def test_two_stages_are_partitioned_independently_and_a_join_stays():
    #   s1.take -> h1 -> join <- h2 <- s2.take
    g = G(reader("r1"), reader("r2"), *fifo_stage(["r1"], "s1"), *fifo_stage(["r2"], "s2"),
          N("h1", "StringToHashBucketFast", ["s1/take"], num_buckets=10),
          N("h2", "StringToHashBucketFast", ["s2/take"], num_buckets=10),
          N("join", "AddV2", ["h1", "h2"], T=tf.int64), N("out", "Identity", ["join"], T=tf.int64))
    p1, p2 = partition(g)
    assert (p1.moved, p2.moved) == (("h1",), ("h2",))
    assert p1.pinned["join"].kind == "other_stage" and p1.pinned["join"].cause == "s2/take"


def test_functional_op_with_stateful_body_pins():
    from tensorflow.core.framework import attr_value_pb2, function_pb2, op_def_pb2

    body = attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name="body"))
    g = G(reader("r", tf.float32), *fifo_stage(["r"], dtypes=[tf.float32]),
          N("call", "PartitionedCall", ["stage/take"], Tin=[tf.float32], Tout=[tf.float32], f=body),
          N("out", "Identity", ["call"], T=tf.float32))
    fdef = function_pb2.FunctionDef(signature=op_def_pb2.OpDef(name="body"))
    fdef.node_def.add(name="p", op="PrintV2")
    g.library.function.append(fdef)
    (p,) = partition(g)
    assert p.pinned["call"].kind == "function_state" and "PrintV2" in p.pinned["call"].detail
