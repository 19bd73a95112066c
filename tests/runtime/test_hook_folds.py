"""make_prefetch_hook() in a stock MonitoredTrainingSession folds a tf.data stage in its begin().

    built:    range(n) -> batch ==iterator==> GetNext -> [lookup(table), hash, /3] -> staged() ~~ take -> loss(w)
    begin():  range(n) -> batch -> map([lookup, hash, /3], deterministic) -> prefetch ==iterator==> GetNext -> loss(w)
    without:  range(n) -> batch ==iterator==> GetNext -> [lookup, hash, /3] -> loss(w)      (no SmartStage at all)

Every loss, step for step, equals the loss of the same stock session on the graph without SmartStage; no
thread of ours runs. What a stock session cannot map (a fetch of the old take) fails naming the fix;
tf_data_stage="lanes" and a SmartStage session's own choice keep the stage on lanes. The restore is
test_restore_exact.py's (a job SIGKILLed after a checkpoint, then resumed).
"""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.runtime.hooks.pipeline_hook import dataset_settings, folded_reads
from tests.runtime.helpers import bounded, lanes_config

VOCABULARY = ["a", "b", "c", "d", "e"]
RECORDS, BATCH = 96, 4
STEPS = RECORDS // BATCH


def _body(batch: dict, table) -> dict:
    return {"index": table.lookup(batch["category"]),
            "bucket": tf.strings.to_hash_bucket_fast(batch["category"], 8),
            "value": batch["value"] / 3.0}   # a division by a constant: Grappler rewrites it in the step


def _training_graph(staged_arguments: dict | None):
    """(loss after the step, the iterator, what staged() returned or None); staged_arguments None: no stage."""
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(VOCABULARY), tf.range(len(VOCABULARY), dtype=tf.int64)), default_value=0)

    def record(i):
        return {"category": tf.gather(tf.constant(VOCABULARY), (i * 7) % len(VOCABULARY)),
                "value": tf.cast(i % 11, tf.float32) + 0.25}

    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(RECORDS).map(record).batch(BATCH))
    features = _body(iterator.get_next(), table)
    staged = None
    if staged_arguments is not None:
        features = staged = ss.staged(features, **staged_arguments)
    weights = tf.compat.v1.get_variable("w", [len(VOCABULARY)], initializer=tf.compat.v1.ones_initializer())
    buckets = tf.compat.v1.get_variable("v", [8], initializer=tf.compat.v1.zeros_initializer())
    score = tf.gather(weights, features["index"]) * tf.gather(buckets, features["bucket"]) + 0.1
    loss = tf.reduce_mean(tf.square(score - features["value"]))
    train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss)
    with tf.control_dependencies([train_op]):
        loss_after = tf.identity(loss)
    return loss_after, iterator, staged


def _scaffold(iterator) -> tf.compat.v1.train.Scaffold:
    return tf.compat.v1.train.Scaffold(local_init_op=tf.group(tf.compat.v1.tables_initializer(), iterator.initializer))


def _losses(staged_arguments: dict | None, hooks) -> list[float]:
    with tf.Graph().as_default():
        loss, iterator, _ = _training_graph(staged_arguments)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks(), scaffold=_scaffold(iterator),
                                                         log_step_count_steps=None) as sess:
            got = [float(sess.run(loss, options=bounded())) for _ in range(STEPS)]
            assert [t.name for t in threading.enumerate() if t.name.startswith("smartstage")] == []
            assert ss.stage_defs(tf.compat.v1.get_default_graph()) == []
    return got


@pytest.mark.parametrize("threads, capacity", [(1, 4), (4, 40), (ss.AUTOTUNE, ss.AUTOTUNE)])
def test_every_loss_equals_the_stock_session_without_smartstage(threads, capacity):
    without = _losses(None, hooks=list)
    hooked = _losses(dict(capacity=capacity, num_threads=threads), hooks=lambda: [ss.make_prefetch_hook()])
    assert len(set(without)) > STEPS // 2          # the losses move: equal lists say something
    assert hooked == without


def test_begin_folds_the_stage_into_its_dataset_before_the_graph_is_finalized(graph):
    loss, iterator, _ = _training_graph(dict(capacity=5, num_threads=3))
    hook = ss.make_prefetch_hook()
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], scaffold=_scaffold(iterator)) as sess:
        assert graph.finalized
        assert list(folded_reads(graph)) == ["stage"] and dataset_settings(graph, "stage") == (3, 5)
        sess.run(loss, options=bounded())
        assert hook.threads is None  # every stage folded: the hook starts nothing and does not enter the lanes


@pytest.mark.parametrize("named", ["name", "StageDef"])
def test_a_hook_naming_a_stage_the_fold_takes_starts_nothing_for_it(graph, named):
    loss, iterator, _ = _training_graph(dict(capacity=2, num_threads=2))
    (stage_def,) = ss.stage_defs(graph)
    hook = ss.make_prefetch_hook(stages=["stage" if named == "name" else stage_def])
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], scaffold=_scaffold(iterator)) as sess:
        assert list(folded_reads(graph)) == ["stage"] and hook.threads.stage_names == []
        sess.run(loss, options=bounded())


def test_a_fetch_of_the_old_take_fails_naming_the_fix(graph):
    loss, iterator, staged = _training_graph(dict(capacity=2, num_threads=1))
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()],
                                                     scaffold=_scaffold(iterator)) as sess:
        with pytest.raises(ss.TargetError, match=r"cannot fetch 'stage/take:\d' in a stock session.*"
                                                 r"smartstage.MonitoredTrainingSession.*tf_data_stage='lanes'"):
            sess.run([loss, staged["value"]], options=bounded())
        sess.run(loss, options=bounded())              # the step itself runs on


def test_another_hooks_fetch_of_the_old_take_fails_at_once_naming_the_fold(graph):
    # A stock session runs the other hooks' SessionRunArgs as given; the old take's guard fails that run.
    loss, iterator, staged = _training_graph(dict(capacity=2, num_threads=1))
    logging_hook = tf.compat.v1.train.LoggingTensorHook({"value": staged["value"]}, every_n_iter=1)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook(), logging_hook],
                                                     scaffold=_scaffold(iterator)) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="folded the stage into its tf.data dataset"):
            sess.run(loss, options=bounded())


def test_tf_data_stage_lanes_keeps_the_stage_on_lanes(graph):
    loss, iterator, _ = _training_graph(dict(capacity=2, num_threads=1))
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook(tf_data_stage="lanes")],
                                                     scaffold=_scaffold(iterator)) as sess:
        assert [d.name for d in ss.stage_defs(graph)] == ["stage"] and folded_reads(graph) == {}
        sess.run(loss, options=bounded())


def test_a_smartstage_session_decides_and_the_hook_folds_nothing_more(graph):
    loss, iterator, _ = _training_graph(dict(capacity=2, num_threads=1))
    with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()], scaffold=_scaffold(iterator),
                                     config=lanes_config()) as sess:
        assert [d.name for d in ss.stage_defs(graph)] == ["stage"] and folded_reads(graph) == {}
        sess.run(loss, options=bounded())


def test_an_unknown_tf_data_stage_is_refused():
    with pytest.raises(ss.ConfigError, match=r"tf_data_stage='queue'.*'fold'.*'lanes'"):
        ss.make_prefetch_hook(tf_data_stage="queue")
