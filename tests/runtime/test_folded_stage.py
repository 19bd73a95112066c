"""A staged() stage on a tf.data iterator in a SmartStage session: folded into the dataset, flag on and off.

    graph:   range(n) -> iterator -> GetNext -> [*3, hash] -> staged(capacity, num_threads) -> step
    folded:  range(n) -> map([*3, hash], num_threads, deterministic) -> prefetch(capacity) -> iterator -> GetNext

What each staged() parameter becomes (capacity -> prefetch buffer, num_threads -> map parallelism, AUTOTUNE
-> AUTOTUNE, deterministic=False -> an unordered map), which stages keep their lanes (a feed_dict, closed or
ignored error types the dataset cannot honour, tf_data_stage="lanes"), the runs per step (one) and the
threads of ours (none), and the warning when a lanes stage reads a checkpointed iterator.
"""

from __future__ import annotations

import logging
import threading

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.runtime.hooks.pipeline_hook import dataset_settings, folded_reads
from smartstage.runtime.lanes import saved_inputs
from tests.runtime.helpers import RunCounter, bounded, lanes_config

STEPS = 12


def _config(on: bool) -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage").parameter_map[
        "do_smart_stage"].b = on
    return config


def _staged(n: int = 10**6, **arguments):
    """(the step's fetch, the iterator): the body before staged() (flag off folds it), the rest after."""
    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(n))
    x = iterator.get_next()
    body = {"x": x * 3, "bucket": tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), 10)}
    features = ss.staged(body, **arguments)
    return features["x"] + features["bucket"] * 0, iterator


def _smartstage_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("smartstage")]


@pytest.mark.parametrize("on", [False, True])
def test_a_folded_stage_runs_one_session_run_a_step_and_no_thread_of_ours(graph, monkeypatch, on):
    y, iterator = _staged(capacity=5, num_threads=3)
    scaffold = tf.compat.v1.train.Scaffold(local_init_op=iterator.initializer)
    with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()], scaffold=scaffold, config=_config(on)) as sess:
        assert ss.stage_defs(graph) == [] and list(folded_reads(graph)) == ["stage"]
        assert dataset_settings(graph, "stage") == (3, 5)     # num_threads -> map, capacity -> prefetch
        counter = RunCounter(monkeypatch)
        got = [int(sess.run(y, options=bounded())) for _ in range(STEPS)]
        assert _smartstage_threads() == []
    assert got == [3 * i for i in range(STEPS)]               # input order
    assert counter.calls == STEPS                             # one session.run per training step


def test_autotune_stays_autotune_and_an_unordered_stage_gets_an_unordered_map(graph):
    y, _ = _staged(deterministic=False)
    with ss.Session(graph=graph, config=_config(False)) as sess:
        assert dataset_settings(graph, "stage") == (-1, -1)
        (parallel_map,) = [op for op in graph.get_operations() if op.type == "ParallelMapDatasetV2"]
        assert parallel_map.get_attr("deterministic") == b"false"
        del sess


@pytest.mark.parametrize("arguments, why", [
    (dict(closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError)), "closes on"),
    (dict(ignored_exception_types=(tf.errors.DataLossError,)), "ignores"),
])
def test_a_stage_with_an_error_policy_a_dataset_cannot_honour_keeps_its_lanes(graph, arguments, why):
    y, iterator = _staged(**arguments)
    with ss.Session(graph=graph, config=_config(False)) as sess:
        sess.run(iterator.initializer)
        assert [d.name for d in ss.stage_defs(graph)] == ["stage"] and folded_reads(graph) == {}
        (fold,) = [r for r in sess.smart_stage.result.reports if r.name == "fold_dataset"]
        assert any(why in line and "keeps its buffer and lanes" in line for line in fold.summary), fold.summary
        assert [int(sess.run(y, options=bounded())) for _ in range(3)] == [0, 3, 6]


def test_a_stage_with_a_feed_dict_keeps_its_lanes(graph):
    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(100))
    scale = tf.compat.v1.placeholder(tf.int64, [], name="scale")
    y = ss.staged(iterator.get_next() * scale, feed_dict={scale: 2})
    with ss.Session(graph=graph, config=_config(False)) as sess:
        sess.run(iterator.initializer)
        assert [d.name for d in ss.stage_defs(graph)] == ["stage"] and folded_reads(graph) == {}
        assert [int(sess.run(y, options=bounded())) for _ in range(3)] == [0, 2, 4]


def test_a_lanes_stage_on_a_checkpointed_iterator_warns_once(graph, caplog, monkeypatch):
    monkeypatch.setattr(saved_inputs, "_warned", set())
    y, iterator = _staged(capacity=2, num_threads=1)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                   tf.data.experimental.make_saveable_from_iterator(iterator))
    with caplog.at_level(logging.WARNING, logger="smartstage"):
        for _ in range(2):  # two sessions of the same graph: one warning
            with ss.Session(graph=graph, config=lanes_config()) as sess:
                sess.run(iterator.initializer)
                sess.run(y, options=bounded())
    warnings = [r.getMessage() for r in caplog.records if "checkpointed" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "stage 'stage'" in warnings[0] and f"'{iterator._iterator_resource.op.name}'" in warnings[0]
    assert "tf_data_stage='fold'" in warnings[0]


def test_flag_off_a_fold_the_passes_refuse_leaves_the_stage_on_lanes_with_a_warning(graph, caplog, monkeypatch):
    from smartstage.errors import GraphError
    from smartstage.session import session as session_module

    def refuse(graph, options, targets=()):
        raise GraphError("node 'x' cannot be folded (a test's refusal)")

    monkeypatch.setattr(session_module, "rewrite_live_graph", refuse)
    y, iterator = _staged(capacity=2, num_threads=1)
    with caplog.at_level(logging.WARNING, logger="smartstage"):
        with ss.Session(graph=graph, config=_config(False)) as sess:
            sess.run(iterator.initializer)
            assert [int(sess.run(y, options=bounded())) for _ in range(3)] == [0, 3, 6]
            assert [d.name for d in ss.stage_defs(graph)] == ["stage"] and sess.smart_stage is None
    assert any("keep their lanes, not folded: node 'x' cannot be folded" in r.getMessage() for r in caplog.records)
