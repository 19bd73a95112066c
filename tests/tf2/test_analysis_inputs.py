"""The TF2 analysis partitions a traced step at its inputs (passes.partition_inputs), with no stage written into
its graph, and gets what a v1 stage at those inputs gets from optimize(): the reference route, kept here only,
stages the analysis graph's inputs (tests/passes/stage_graphs.staged_at_inputs) and optimizes it.

    analysis = analyse(traced, tables)                   # the partition at traced.inputs
    reference = optimize(staged_at_inputs(analysis.graph_def, traced.inputs), targets=traced.targets)
    analysis.partition ~ reference.partitions[0]         # the same moved, pinned, boundary, skip reason
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import smartstage.tf2 as sst
from smartstage.config.options import enable_smart_stage
from smartstage.errors import NothingToMoveError
from smartstage.graph.stages import INPUTS
from smartstage.optimizer import optimize
from smartstage.passes.pins import Pin
from tests.passes.stage_graphs import staged_at_inputs
from tests.tf2.keras_models import preprocessing_model, raw_dataset as keras_dataset
from tests.tf2.steps import dlrm_program, raw_dataset

pytestmark = pytest.mark.usefixtures("eager")

STAGE = "smartstage/input"


def reference_partition(graph_def, inputs, targets):
    """The partition optimize() gives the analysis graph with a FIFO stage at `inputs`."""
    return optimize(staged_at_inputs(graph_def, inputs, STAGE), enable_smart_stage(), targets=targets).partitions[0]


def _as_inputs(text: str, take_ports) -> str:
    """`text` with each output of the reference's take named as the input tensor it stands for."""
    return re.sub(re.escape(STAGE) + r"/take:(\d+)", lambda m: take_ports[int(m.group(1))], text)


def assert_same_partition(got, want):
    assert got.stage.kind == INPUTS
    assert got.stage.ops == got.stage.inputs and not got.stage.put and not got.stage.take
    assert got.moved == want.moved
    ports = want.take_ports
    assert dict(got.pinned) == {name: Pin(p.kind, p.cause, _as_inputs(p.detail, ports), p.via)
                                for name, p in want.pinned.items()}
    assert list(got.pinned) == list(want.pinned)
    assert got.boundary_before == want.boundary_before and got.take_ports == want.take_ports
    assert got.boundary_after == want.boundary_after
    assert got.control_reroutes == want.control_reroutes and got.recomputed == want.recomputed
    assert got.skipped == want.skipped.replace("of the take", "of the inputs").replace("the take has",
                                                                                       "the inputs have")
    assert got.take_readers == want.take_readers and got.main_readers == want.main_readers
    assert got.changes_graph == want.changes_graph


@pytest.fixture
def analyses(monkeypatch):
    """Every Analysis the split routes compute while the test runs, with its traced step."""
    from smartstage.tf2.step.analysis import analyse

    seen = []

    def recorded(traced, tables, read_only=True):
        analysis = analyse(traced, tables, read_only)
        seen.append((traced, analysis))
        return analysis

    for module in ("smartstage.tf2.step.split", "smartstage.tf2.keras.layers"):
        monkeypatch.setattr(sys.modules[module], "analyse", recorded)
    return seen


def _check(seen, at_least=1):
    assert len(seen) >= at_least
    for traced, analysis in seen:
        assert not any(n.op.startswith("Queue") or n.op == "FIFOQueueV2" for n in analysis.graph_def.node)
        assert_same_partition(analysis.partition, reference_partition(analysis.graph_def, traced.inputs,
                                                                      traced.targets))


def test_the_dlrm_step(analyses):
    split = sst.split(dlrm_program().step, raw_dataset())
    _check(analyses)
    assert split.moved and "Bucketize" in split.moved


def _python_and_state_step():
    w = tf.Variable(tf.ones([4]))

    @tf.function
    def step(ids):
        a = tf.numpy_function(lambda v: v % 4, [ids], tf.int64, stateful=False)
        noise = tf.random.uniform(tf.shape(ids), seed=1)
        kept = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 4)
        with tf.control_dependencies([tf.debugging.assert_non_negative(ids)]):
            loss = tf.reduce_sum(tf.gather(w, a) + tf.gather(w, kept)) + tf.reduce_sum(noise)
        w.assign_sub(0.01 * tf.ones([4]))
        return loss

    return step


def test_a_step_with_python_random_ops_and_an_assert(analyses):
    ds = tf.data.Dataset.from_tensor_slices(np.array([1, 2, 3, 1], np.int64)).batch(2)
    sst.split(_python_and_state_step(), ds)
    _check(analyses)


def test_a_step_where_nothing_moves(analyses):
    w = tf.Variable(tf.ones([3]))

    @tf.function
    def step(x):
        return tf.reduce_sum(w * x)

    ds = tf.data.Dataset.from_tensor_slices(np.ones((8, 3), np.float32)).batch(4)
    with pytest.raises(NothingToMoveError, match="every consumer of the inputs stays on the main side"):
        sst.split(step, ds)
    _check(analyses)


def test_a_keras_train_step_and_its_layer_calls(analyses):
    model = preprocessing_model()
    sst.split(tf.function(model.train_step), keras_dataset())
    sst.split_model(preprocessing_model())
    _check(analyses, at_least=3)


def test_the_split_is_inspectable_without_a_stage_in_its_graph(analyses):
    split = sst.split(dlrm_program().step, raw_dataset())
    result = split.result
    assert result.graph_def is result.original_graph_def and result.fetch_map() == {}
    assert "stage 'inputs' (the graph's inputs: " in result.summary()
    diff = split.diff()
    assert {m.name for m in diff.moved} == set(split.moved) and not diff.added and not diff.rewired
    (stage,) = diff.stages
    assert stage.boundary_before == split.analysis.partition.boundary_before
    assert stage.boundary_after == split.analysis.partition.boundary_after
    assert stage.prefetch_nodes_before == 0 and stage.prefetch_nodes_after == len(split.moved)
    first_input = split.traced.inputs[0]
    assert split.explain(first_input).verdict == "stage_op"
    assert "the graph's inputs" in split.explain("Bucketize").text()
