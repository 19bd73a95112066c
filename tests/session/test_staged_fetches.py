"""Fetching what staged() returned, with the flag on: the batch the step trains on, however it is fetched.

    f = ss.staged(features); ids = hash(f["cat"])     # every reader of f["cat"] moves behind the stage
    sess.run([train_op, f["cat"]])                     # served by the new take: the batch trained on
The session keeps every output of a staged() take crossing the rebuilt buffer, marked or not.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.session import Session
from tests.session.graphs import bounded, flag, init_ops, small_model

STEPS = 5


def _ids_of(cats) -> np.ndarray:
    """What the model's `ids` are for a batch of categories: the check that a fetched batch is the trained one."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(tf.strings.to_hash_bucket_fast(tf.constant(cats), 50))


def _session_values(on: bool, how: str) -> list:
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        staged = model.features["cat"]  # read only by `ids`, which moves: nothing on the main side reads it
        targets = None
        if how == "mark":
            ss.mark_target_node([staged])
        elif how == "session_targets":
            targets = [staged]
    with Session(graph=graph, config=flag(on), targets=targets) as sess:
        sess.run(init_ops(graph))
        values = [sess.run([staged, model.ids, model.train_op], options=bounded())[:2] for _ in range(2)]
        step = sess.make_callable([staged, model.ids, model.train_op])
        values += [step()[:2] for _ in range(2)]
    return values


@pytest.mark.parametrize("how", ["unmarked", "mark", "session_targets"])
def test_a_staged_tensor_is_fetched_with_the_batch_trained_on(how):
    before, after = _session_values(False, how), _session_values(True, how)
    for (cats_before, ids_before), (cats_after, ids_after) in zip(before, after):
        np.testing.assert_array_equal(cats_before, cats_after)
        np.testing.assert_array_equal(ids_after, _ids_of(cats_after))  # the same step's batch, not the next


def test_the_session_keeps_every_staged_output_crossing_the_rebuilt_buffer():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    with Session(graph=graph, config=flag()) as sess:
        record = sess.smart_stage
        # every output of the old take is served by a new take output, so none of them fails to fetch
        take = graph.get_operation_by_name("stage/take")
        assert {t.name for t in take.outputs} <= set(record.tensor_map)
        sess.run(init_ops(graph))
        cats, ids, _ = sess.run([model.features["cat"], model.ids, model.train_op], options=bounded())
        np.testing.assert_array_equal(ids, _ids_of(cats))


class _StagedHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, tensor):
        self.tensor, self.seen = tensor, []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.tensor)

    def after_run(self, run_context, run_values):
        self.seen.append(run_values.results)


def test_monitored_session_and_hooks_fetch_a_marked_staged_tensor():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        staged = model.features["cat"]
        ss.mark_target_node([staged])
        hook = _StagedHook(staged)
        steps = []
        with MonitoredTrainingSession(config=flag(), hooks=[ss.make_prefetch_hook(), hook]) as sess:
            while len(steps) < STEPS:
                steps.append(sess.run({"cat": staged, "ids": model.ids, "train": model.train_op}))
    for step, seen in zip(steps, hook.seen):
        np.testing.assert_array_equal(step["cat"], seen)  # the hook saw the step's own batch
        np.testing.assert_array_equal(step["ids"], _ids_of(step["cat"]))


def test_partial_run_fetches_a_marked_staged_tensor():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
        staged = model.features["cat"]
        ss.mark_target_node([staged])
    with Session(graph=graph, config=flag()) as sess:
        sess.run(init_ops(graph))
        sess.run(model.ids, options=bounded())  # starts the prefetch threads
        handle = sess.partial_run_setup([staged, model.ids], [])
        cats, ids = sess.partial_run(handle, [staged, model.ids])
        np.testing.assert_array_equal(ids, _ids_of(cats))


def test_offline_a_take_output_named_as_target_keeps_crossing():
    graph = tf.Graph()
    with graph.as_default():
        model = small_model()
    meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    take_output = model.features["cat"].name
    dropped = ss.optimize(meta, ss.enable_smart_stage()).fetch_map()
    kept = ss.optimize(meta, ss.enable_smart_stage(), targets=[take_output])
    assert take_output not in dropped
    (partition,) = kept.partitions
    carried = partition.take_ports[model.features["cat"].value_index]
    assert carried in partition.boundary_after
    # the small model reads a tf.data iterator: its stage is folded, the iterator read carries the boundary
    read = "stage/dataset_fold/IteratorGetNext"
    assert read in {n.name for n in kept.graph_def.node}
    assert kept.fetch_map()[take_output] == f"{read}:{partition.boundary_after.index(carried)}"
