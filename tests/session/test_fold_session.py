"""A folded stage in a session with the flag: the same steps as flag off, one session.run per step, no thread
of SmartStage's, and fetches of staged tensors give the batch trained on."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.client import session as tf_session

import smartstage as ss
from smartstage.errors import TargetError
from smartstage.session.record import live_rewrite_of

ROWS, BATCH = 40, 4
STEPS = ROWS // BATCH
ON = ss.enable_smart_stage(tf.compat.v1.ConfigProto())


def build(form="initializable", capacity=4, num_threads=1):
    #   batch ==MakeIterator==> it -> IteratorGetNext -> put ~~ take -> sqrt, lookup(table) -> add -> mul(w) -> loss
    # Returns the graph and what the user holds: the staged features, the body's `sqrt`, loss, train op.
    graph = tf.Graph()
    with graph.as_default():
        rows = tf.data.Dataset.range(ROWS).map(
            lambda i: {"id": tf.strings.as_string(i % 5), "x": tf.cast(i, tf.float32)}).batch(BATCH)
        if form == "one_shot":
            iterator = tf.compat.v1.data.make_one_shot_iterator(rows)
        elif form == "reinitializable":
            iterator = tf.compat.v1.data.Iterator.from_structure(tf.compat.v1.data.get_output_types(rows),
                                                                 tf.compat.v1.data.get_output_shapes(rows))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.make_initializer(rows))
        else:
            iterator = tf.compat.v1.data.make_initializable_iterator(rows)
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        features = ss.staged(iterator.get_next(), capacity=capacity, num_threads=num_threads)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["1", "2"], [1, 2], key_dtype=tf.string, value_dtype=tf.int64), 0)
        sqrt = tf.sqrt(features["x"], name="sqrt")
        x = sqrt + tf.cast(table.lookup(features["id"]), tf.float32)
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(x * w, name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
    return graph, {"features": features, "sqrt": sqrt, "loss": loss, "train": train}


def steps(config, form="initializable", capacity=4, num_threads=1, fetch_features=True):
    """Every step's loss and the staged x it trained on, in an ss.Session; and the record of the rewrite."""
    graph, held = build(form, capacity, num_threads)
    with graph.as_default(), ss.Session(config=config) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])
        fetches = [held["loss"], held["train"]] + ([held["features"]["x"]] if fetch_features else [])
        values = [sess.run(fetches) for _ in range(STEPS)]
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(held["loss"])
    return values, live_rewrite_of(graph)


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.parametrize("capacity", [4, 40])
def test_every_fetched_value_is_identical_to_flag_off(capacity, num_threads):
    off, _ = steps(tf.compat.v1.ConfigProto(), capacity=capacity, num_threads=num_threads)
    on, record = steps(ON, capacity=capacity, num_threads=num_threads)
    (stage,) = record.stages
    assert stage.folded_into == "IteratorV2"
    for (loss_off, _, x_off), (loss_on, _, x_on) in zip(off, on):
        assert loss_off == loss_on
        np.testing.assert_array_equal(x_off, x_on)
    np.testing.assert_array_equal(np.concatenate([x for _, _, x in on]), np.arange(ROWS, dtype=np.float32))


@pytest.mark.parametrize("form", ["one_shot", "reinitializable"])
def test_the_other_iterator_forms_fold_in_the_session_too(form):
    off, _ = steps(tf.compat.v1.ConfigProto(), form=form)
    on, record = steps(ON, form=form)
    assert [s.folded_into for s in record.stages] == [{"one_shot": "OneShotIterator"}.get(form, "IteratorV2")]
    assert [v[0] for v in off] == [v[0] for v in on]


def test_one_session_run_per_step_and_no_thread_of_smartstage(monkeypatch):
    runs = []
    original = tf_session.BaseSession.run

    def counted(self, fetches, *args, **kwargs):
        runs.append(threading.current_thread().name)
        return original(self, fetches, *args, **kwargs)

    graph, held = build(num_threads=4, capacity=40)
    before = set(threading.enumerate())
    with graph.as_default(), ss.Session(config=ON) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])
        monkeypatch.setattr(tf_session.BaseSession, "run", counted)
        for _ in range(STEPS):
            sess.run(held["train"])
        monkeypatch.setattr(tf_session.BaseSession, "run", original)
        started = set(threading.enumerate()) - before
        assert sess.prefetch_threads is None
    assert runs == [threading.current_thread().name] * STEPS
    assert not started, [t.name for t in started]


def test_fetching_a_moved_tensor_that_does_not_cross_is_refused_with_the_fix():
    graph, held = build()
    with graph.as_default(), ss.Session(config=ON) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])
        with pytest.raises(TargetError, match="mark_target_node"):
            sess.run(held["sqrt"])


def test_a_marked_moved_tensor_is_carried_by_the_iterator_and_gives_the_trained_batch():
    graph, held = build()
    with graph.as_default(), ss.Session(config=ON, targets=[held["sqrt"]]) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])
        sqrt, x = sess.run([held["sqrt"], held["features"]["x"]])
        np.testing.assert_array_equal(sqrt, np.sqrt(x))
        np.testing.assert_array_equal(x, np.arange(BATCH, dtype=np.float32))


def test_a_monitored_training_session_with_the_prefetch_hook_trains_the_folded_stage():
    graph, held = build()
    losses = []
    with graph.as_default():
        with ss.MonitoredTrainingSession(config=ON, hooks=[ss.make_prefetch_hook()]) as sess:
            while not sess.should_stop():
                losses.append(sess.run([held["loss"], held["train"]])[0])
    off, _ = steps(tf.compat.v1.ConfigProto(), fetch_features=False)
    assert losses == [v[0] for v in off]


def test_an_auto_stage_at_an_iterator_folds_and_re_initializing_restarts_the_input_as_stock_does():
    #   range(10).batch(2) ==MakeIterator==> it -> next -> mul(3) -> sum -> assign_add(v)   (no staged(): auto-stage)
    def build_epochs():
        iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(10).batch(2))
        loss = tf.reduce_sum(iterator.get_next(name="next") * 3, name="loss")
        v = tf.compat.v1.get_variable("v", [], tf.int64, initializer=tf.compat.v1.zeros_initializer())
        return iterator, loss, tf.compat.v1.assign_add(v, loss)

    def run(session_of):
        with tf.Graph().as_default():
            iterator, loss, step = build_epochs()
            with session_of() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(iterator.initializer)
                first = [sess.run([loss, step])[0] for _ in range(2)]
                sess.run(iterator.initializer)  # a new epoch from the start, nothing stale
                return first + [sess.run([loss, step])[0] for _ in range(5)], sess

    auto = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), auto_stage=True)
    want, _ = run(tf.compat.v1.Session)
    got, sess = run(lambda: ss.Session(config=auto))
    assert got == want == [3, 15, 3, 15, 27, 39, 51]
    assert [s.folded_into for s in sess.smart_stage.stages] == ["IteratorV2"]


def test_an_initializer_built_after_the_fold_is_refused_with_the_fix():
    graph, held = build("reinitializable")
    with graph.as_default(), ss.Session(config=ON) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        from tensorflow.python.ops import gen_dataset_ops  # what Iterator.make_initializer builds

        iterator = graph.get_operation_by_name("IteratorV2").outputs[0]
        init = gen_dataset_ops.make_iterator(tf.data.experimental.to_variant(tf.data.Dataset.range(8).batch(4)),
                                             iterator)
        with pytest.raises(TargetError, match="build every initializer .* before creating the session"):
            sess.run(init)


def test_gpu_flag_folds_the_work_and_keeps_a_gpu_buffer_filled_by_one_thread():
    from tests.passes.test_fold_dataset import gpu_graph

    def run(config):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.train.import_meta_graph(gpu_graph())
            with ss.Session(config=config) as sess:
                sess.run([tf.compat.v1.global_variables_initializer(),
                          *graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)])
                losses = [sess.run(["loss:0", "train"])[0] for _ in range(STEPS)]
                return losses, live_rewrite_of(graph), ss.stage_defs(graph)

    soft = tf.compat.v1.ConfigProto(allow_soft_placement=True)  # no GPU here: TensorFlow places it on the CPU
    off, _, _ = run(soft)
    gpu = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    on, record, (stage_def,) = run(ss.enable_smart_stage(gpu, do_smart_stage_gpu=True))
    assert on == off
    assert stage_def.num_threads == 1  # the staged() outputs stay fetchable, so the iterator carries them too
    assert all(t.startswith("stage/dataset_fold/IteratorGetNext:") for t in stage_def.boundary_tensors)
    (stage,) = record.stages
    assert not stage.folded_into and stage.new_ops["take"] == "stage/smart_stage/take"  # the buffer is rebuilt
