"""Each CPU pass run by itself through the manager, with a case where it changes the graph and one where it
must not: `changed` is computed, never assumed (the GPU passes have theirs in tests/passes/gpu/)."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from smartstage.config.options import AutoStageOptions, SmartStageOptions
from smartstage.passes.auto_stage import AutoStage
from smartstage.passes.expand_stage import ExpandStage
from smartstage.passes.find_stages import FindStages
from smartstage.passes.manager import PassContext, PassManager
from smartstage.passes.partition import Partition
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage, gather, reader, two_feature_graph, variable


def run(passes, graph_def, **options):
    ctx = PassContext(options=SmartStageOptions(do_smart_stage=True, **options))
    graph, reports = PassManager(passes).run(graph_def, ctx)
    return graph, {r.name: r.changed for r in reports}, ctx


def pinned_consumer_graph():
    #   reader -> put ~~ take -> lookup(w) -> loss     (the only consumer reads a variable: nothing moves)
    return G(reader("r0", tf.int64), *fifo_stage(["r0"], dtypes=[tf.int64]), *variable("w"),
             *gather("lookup", "w/read", "stage/take"),
             N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32))


def _scalar_shapes():
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=[tf.TensorShape([]).as_proto()]))


def iterator_graph():
    #   iterator -> get_next -> hash -> lookup(w) -> loss      (no stage: auto-stage inserts one)
    return G(N("it", "IteratorV2", shared_name="it", container="", output_types=[tf.string], output_shapes=_scalar_shapes()),
             N("get_next", "IteratorGetNext", ["it"], output_types=[tf.string], output_shapes=_scalar_shapes()),
             N("hash", "StringToHashBucketFast", ["get_next"], num_buckets=10),
             *variable("w"), *gather("lookup", "w/read", "hash"),
             N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32))


@pytest.mark.parametrize("graph, moves", [(two_feature_graph, True), (pinned_consumer_graph, False)])
def test_expand_stage_changes_the_graph_exactly_when_something_moves(graph, moves):
    before = graph()
    after, changed, _ = run([FindStages(), Partition(), ExpandStage()], before)
    assert changed == {"find_stages": False, "partition": False, "expand_stage": moves}
    assert (after is before) == (not moves)


def test_analysis_passes_never_change_the_graph_and_provide_their_analysis():
    before = two_feature_graph()
    after, changed, ctx = run([FindStages(), Partition()], before)
    assert after is before and changed == {"find_stages": False, "partition": False}
    assert [s.name for s in ctx.stages] == ["stage"] and len(ctx.partitions) == 1


@pytest.mark.parametrize("graph, inserts", [(iterator_graph, True), (two_feature_graph, False)])
def test_auto_stage_changes_the_graph_exactly_when_it_inserts_a_stage(graph, inserts):
    before = graph()
    after, changed, ctx = run([FindStages(), AutoStage()], before, auto_stage=AutoStageOptions())
    assert changed["auto_stage"] is inserts
    assert (after is before) == (not inserts)
    assert len(ctx.auto_stage.inserted) == (1 if inserts else 0)
