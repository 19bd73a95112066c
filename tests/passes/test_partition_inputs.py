"""partition_inputs: the partition at a graph's own inputs, each case on a hand-drawn graph with the expected
verdict written out, and every case equal to what a v1 stage at the same inputs gives (stage_graphs.staged_at_inputs).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.errors import GraphError, TargetError
from smartstage.graph.stages import INPUTS, find_stages
from smartstage.graph.view import GraphView
from smartstage.passes.partition import partition_stages
from smartstage.passes.partition_inputs import partition_inputs
from tests.builder import G, N
from tests.passes.stage_graphs import gather, staged_at_inputs, variable


def _placeholder(name, dtype=tf.string, shape=None):
    node = N(name, "Placeholder", dtype=dtype)
    if shape is not None:
        node.attr["_output_shapes"].list.shape.add().CopyFrom(tf.TensorShape(shape).as_proto())
    return node


def two_inputs():
    #   words -> hash ----------------------> lookup(w) -> loss
    #   tags  -> lower -> joined(suffix) -> shown             (nothing consumes shown: fetched directly)
    return G(
        _placeholder("words"), _placeholder("tags"),
        N("hash", "StringToHashBucketFast", ["words"], num_buckets=10),
        N("lower", "StringLower", ["tags"]),
        N("suffix", "Const", dtype=tf.string, value=[b"!"]),
        N("joined", "StringJoin", ["lower", "suffix"], N=2),
        N("shown", "Identity", ["joined"], T=tf.string),
        *variable("w"),
        *gather("lookup", "w/read", "hash"),
        N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32),
    )


def an_input_crosses_as_it_is():
    #   words -> hash -> lookup(w) -> scaled -> train
    #   label ---------------------/             ^
    #   hash  - - - - - - - - - - - - - - - - -> done (control)      words - - -> noted (control)
    return G(
        _placeholder("words"), _placeholder("label", tf.float32),
        N("hash", "StringToHashBucketFast", ["words"], num_buckets=10),
        *variable("w"),
        *gather("lookup", "w/read", "hash"),
        N("scaled", "Mul", ["lookup", "label"], T=tf.float32),
        N("done", "NoOp", ["^hash"]),
        N("noted", "Identity", ["w/read", "^words"], T=tf.float32),
        N("train", "Identity", ["scaled", "^done", "^noted"], T=tf.float32),
    )


def dropout_noise():
    #   ids -> cast -> masked -> lookup(w) -> loss
    #   shape(const) -> noise(RandomUniform) -/           (noise of a static shape: pulled behind the boundary)
    return G(
        _placeholder("ids", tf.int64),
        N("cast", "Cast", ["ids"], SrcT=tf.int64, DstT=tf.float32),
        N("shape", "Const", dtype=tf.int32, value=[2]),
        N("noise", "RandomUniform", ["shape"], dtype=tf.float32, T=tf.int32),
        N("masked", "Mul", ["cast", "noise"], T=tf.float32),
        N("ids2", "Cast", ["masked"], SrcT=tf.float32, DstT=tf.int64),
        *variable("w"),
        *gather("lookup", "w/read", "ids2"),
        N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32),
    )


def shape_only():
    #   x[4,3] -> Shape -> fill(zeros) -> plus(w) -> loss        (the moved part is shape arithmetic only)
    return G(
        _placeholder("x", tf.float32, [4, 3]),
        N("Shape", "Shape", ["x"], T=tf.float32, out_type=tf.int32),
        N("zero", "Const", dtype=tf.float32, value=0.0),
        N("fill", "Fill", ["Shape", "zero"], T=tf.float32, index_type=tf.int32),
        *variable("w", (4, 3)),
        N("plus", "AddV2", ["fill", "w/read"], T=tf.float32),
        N("loss", "Identity", ["plus"], T=tf.float32),
    )


def read_by_the_model_only():
    #   ids -> lookup(w) -> loss        (the first reader of the input reads a variable: nothing moves)
    return G(
        _placeholder("ids", tf.int64),
        *variable("w"),
        *gather("lookup", "w/read", "ids"),
        N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32),
    )


CASES = {
    "two_inputs": (two_inputs, ("words", "tags"), ()),
    "an_input_crosses_as_it_is": (an_input_crosses_as_it_is, ("words", "label"), ("train", "done")),
    "dropout_noise": (dropout_noise, ("ids",), ("loss",)),
    "shape_only": (shape_only, ("x",), ("loss",)),
    "read_by_the_model_only": (read_by_the_model_only, ("ids",), ("loss",)),
}


def test_two_inputs_move_their_preprocessing_and_pin_the_lookup():
    p = partition_inputs(two_inputs(), ["words", "tags"], [])
    assert p.stage.kind == INPUTS and p.stage.take_nodes == ("words", "tags") and not p.stage.put
    assert p.moved == ("hash", "lower", "joined")
    assert p.pinned["lookup"].kind == "variable" and p.pinned["lookup"].cause == "w"
    assert p.pinned["loss"].via == "lookup"
    assert p.pinned["shown"].kind == "fetched_directly"
    assert p.boundary_before == ("words:0", "tags:0") == p.take_ports
    assert p.boundary_after == ("hash:0", "joined:0")
    assert p.take_readers == ("hash", "lower") and p.main_readers == ("lookup", "shown")
    assert p.changes_graph


def test_an_input_the_main_side_reads_keeps_crossing_and_control_edges_are_rerouted():
    p = partition_inputs(an_input_crosses_as_it_is(), ["words", "label"], ["train", "done"])
    assert p.moved == ("hash",)
    assert p.boundary_after == ("label:0", "hash:0")  # the old components first, in their old order
    assert p.control_reroutes == (("hash", "done"),)  # an input's own control edge needs no reroute
    assert p.pinned["done"].kind == "target" and p.pinned["noted"].kind == "variable"


def test_a_random_source_of_a_static_shape_is_pulled_behind_the_inputs():
    p = partition_inputs(dropout_noise(), ["ids"], ["loss"])
    assert p.moved == ("noise", "cast", "masked", "ids2")  # pulled sources first: the sweep is re-run with them
    assert p.boundary_after == ("ids2:0",)


def test_shape_arithmetic_alone_is_not_worth_moving():
    p = partition_inputs(shape_only(), ["x"], ["loss"])
    assert not p.changes_graph
    assert p.skipped.startswith("nothing worth moving: the moved part is shape arithmetic only (Fill, Shape)")


def test_nothing_moves_when_every_reader_of_the_inputs_stays():
    p = partition_inputs(read_by_the_model_only(), ["ids"], ["loss"])
    assert p.moved == () and not p.changes_graph
    assert p.skipped == ("nothing to move: every consumer of the inputs stays on the main side (e.g. 'lookup': "
                         "reads variable 'w' (via 'w/read'))")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_partition_as_a_stage_at_the_inputs(case):
    build, inputs, targets = CASES[case]
    graph_def = build()
    got = partition_inputs(GraphView(graph_def), inputs, targets)
    staged = GraphView(staged_at_inputs(graph_def, inputs))
    stages, _ = find_stages(staged)
    (want,) = partition_stages(staged, stages, set(targets), set())
    assert got.moved == want.moved
    assert dict(got.pinned) == dict(want.pinned)
    assert got.boundary_before == want.boundary_before and got.take_ports == want.take_ports
    assert got.boundary_after == want.boundary_after
    assert got.control_reroutes == want.control_reroutes and got.recomputed == want.recomputed
    assert got.skipped == want.skipped.replace("of the take", "of the inputs").replace("the take has", "the inputs have")
    assert got.take_readers == want.take_readers and got.main_readers == want.main_readers


def test_names_are_checked():
    with pytest.raises(TargetError, match="'nope' names no node"):
        partition_inputs(two_inputs(), ["words"], ["nope"])
    with pytest.raises(GraphError, match="'words' is an input and also a target"):
        partition_inputs(two_inputs(), ["words"], ["words"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pass_manager_route_gives_the_same_partition(case):
    # optimize()'s PassManager running InputBoundary then Partition: the partition_inputs() verdict, the graph
    # returned as it was given, one report per pass.
    from smartstage.optimizer import partition_at_inputs

    build, inputs, targets = CASES[case]
    graph_def = build()
    result = partition_at_inputs(graph_def, inputs, targets)
    (got,) = result.partitions
    want = partition_inputs(graph_def, inputs, targets)
    assert (got.moved, dict(got.pinned), got.boundary_after, got.skipped) == \
        (want.moved, dict(want.pinned), want.boundary_after, want.skipped)
    assert result.graph_def is graph_def and not result.changed
    assert [r.name for r in result.reports] == ["input_boundary", "partition"]
    assert not any(r.changed for r in result.reports)


def test_the_pass_manager_route_names_the_pass_that_refused():
    from smartstage.optimizer import partition_at_inputs

    with pytest.raises(GraphError, match=r"'words' is an input and also a target.*\[in pass 'input_boundary' "
                                         r"\(the first pass\)\]"):
        partition_at_inputs(two_inputs(), ["words"], ["words"])
