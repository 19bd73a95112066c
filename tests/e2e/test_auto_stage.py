"""Auto-stage on real sessions: the same values as without it, step by step, through end of input,
re-initialised iterators, several input pipelines and re-created sessions.

Every batch of the small graphs here is identifiable: `loss = sum(batch * w)` with w = 1 and a zero
learning rate is the batch's sum, so a lost, repeated or stale batch changes the sequence of losses.
Every step runs with a bounded RunOptions timeout: a bug fails a test instead of hanging it.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage import examples
from smartstage.inspection.replay import compare_runs
from smartstage.graph.view import GraphView
from smartstage.runtime import run_initializer
from tests.bounds import HANG_MILLIS

STEP_MILLIS = HANG_MILLIS


def auto(capacity: int = 3, num_threads: int = 1, **kwargs) -> tf.compat.v1.ConfigProto:
    """Auto-stage with room for stale batches: a stage holds up to `capacity` batches read ahead (lanes: these
    tests check the inserted stage's buffer; tests/session/test_fold_session.py covers the fold)."""
    return ss.enable_smart_stage(tf.compat.v1.ConfigProto(), tf_data_stage="lanes", auto_stage=ss.AutoStageOptions(
        capacity=capacity, num_threads=num_threads, **kwargs))


def bounded() -> tf.compat.v1.RunOptions:
    return tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)


def _sum_loss(x, name):
    """sum(x) * w with w = 1 that never changes: the loss names the batch; the step still trains."""
    w = tf.compat.v1.get_variable(f"w_{name}", [], initializer=tf.ones_initializer())
    loss = tf.reduce_sum(tf.cast(x, tf.float32) * w, name=f"{name}_loss")
    return loss, tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(loss, name=f"{name}_step")


def train_eval_graph(eval_fetches_batch: bool = False):
    """A one-shot train iterator (0..29) and an initializable eval iterator (1000..1009) in one graph.

        train_next -> x * 2 -> train_loss(w) -> train_step
        eval_next  -> x + 1 -> eval_loss(w)        (or the eval loop fetches eval_next itself)
    """
    train_it = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(30).batch(2))
    eval_it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(1000, 1010).batch(2))
    train_loss, train_step = _sum_loss(train_it.get_next(name="train_next") * 2, "train")
    eval_next = eval_it.get_next(name="eval_next")
    eval_loss, _ = _sum_loss(eval_next + 1, "eval")
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_step)
    eval_fetch = eval_next if eval_fetches_batch else eval_loss
    return {"train": [train_loss, train_step], "eval": eval_fetch, "eval_init": eval_it.initializer,
            "init": tf.compat.v1.global_variables_initializer()}


def schedule(run, handles, rounds=3, train_steps=3, eval_steps=None):
    """Train a few steps, then an eval round (initializer, then batches until the end or `eval_steps`), ...
    Returns every fetched value in order."""
    seen = []
    for _ in range(rounds):
        for _ in range(train_steps):
            seen.append(("train", float(run(handles["train"])[0])))
        run(handles["eval_init"])
        count = 0
        while eval_steps is None or count < eval_steps:
            try:
                seen.append(("eval", np.asarray(run(handles["eval"])).tolist()))
            except tf.errors.OutOfRangeError:
                seen.append(("eval", "end"))
                break
            count += 1
    return seen


def _stock(build, drive):
    with tf.Graph().as_default():
        handles = build()
        with tf.compat.v1.Session() as sess:
            sess.run(handles["init"])
            return drive(functools.partial(sess.run, options=bounded()), handles)


def _targets(handles):
    return [handles["eval"]]


# -- the DLRM-like model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    return examples.prepare_criteo(tmp_path_factory.mktemp("criteo"), num_rows=800, seed=0, vocabulary_max_size=50)


def _export(build):
    g = tf.Graph()
    with g.as_default():
        model = build()
        return tf.compat.v1.train.export_meta_graph(), model


def test_dlrm_without_staged_moves_what_a_hand_placed_stage_moves_and_trains_identically(criteo):
    one_thread = functools.partial(ss.staged, num_threads=1)
    hand_meta, model = _export(lambda: examples.build_dlrm(criteo.data_path, criteo.vocabulary_paths,
                                                           stage_fn=one_thread))
    auto_meta, _ = _export(lambda: examples.build_dlrm(criteo.data_path, criteo.vocabulary_paths))
    hand = ss.optimize(hand_meta, ss.enable_smart_stage())
    automatic = ss.optimize(auto_meta, auto(capacity=1))
    (inserted,) = automatic.extra["auto_stage"].inserted
    assert inserted.source.kind == "iterator"
    # What sits between the iterator and the hand-placed stage (the CSV parsing) moves too; the rest is
    # the same set of nodes, pinned for the same reasons.
    (hand_stage,) = hand.partitions
    parsing = GraphView(hand_meta.graph_def).ancestors([hand_stage.stage.put]) - set(hand_stage.stage.ops)
    assert automatic.moved() - parsing == hand.moved()
    assert automatic.moved() & parsing  # decode_csv and its friends moved
    (auto_stage,) = automatic.partitions
    assert {n: p.kind for n, p in auto_stage.pinned.items()} == {n: p.kind for n, p in hand_stage.pinned.items()}
    fetches = [model.loss.name, model.predictions.name]
    # sessions that rewrite what they run (the default): both stages fold, and each map's body is rewritten as a
    # session rewrites it (passes/dataset_map.py), so the two agree under the rewrites, not as written
    comparison = compare_runs(hand.meta_graph_def, automatic.meta_graph_def, fetches, steps=20,
                              config=tf.compat.v1.ConfigProto())
    assert comparison.identical, comparison.describe()
    assert len(comparison.before.values) == 20


def test_dlrm_reading_through_queues_gets_a_stage_at_the_batch_dequeue_and_ends_like_stock(criteo):
    options = examples.InputOptions(reader="queue", num_epochs=1, batch_size=64)
    meta, model = _export(lambda: examples.build_dlrm(criteo.data_path, criteo.vocabulary_paths,
                                                      input_options=options))
    result = ss.optimize(meta, auto())
    (inserted,) = result.extra["auto_stage"].inserted
    assert inserted.source.kind == "queue"
    comparison = compare_runs(meta, result.meta_graph_def, [model.loss.name], steps=50)
    assert comparison.identical, comparison.describe()
    assert comparison.after.ended and len(comparison.after.values) == 800 // 64  # the last partial batch dropped


# -- a train iterator and an eval iterator ------------------------------------------------------------


def test_train_and_eval_iterators_with_ss_session():
    want = _stock(train_eval_graph, schedule)
    with tf.Graph().as_default():
        handles = train_eval_graph()
        with ss.Session(config=auto(), targets=_targets(handles)) as sess:
            assert [s.name for s in sess.smart_stage.stages] == ["smart_stage", "smart_stage_1"]
            sess.run(handles["init"])
            got = schedule(functools.partial(sess.run, options=bounded()), handles)
    assert got == want
    assert want.count(("eval", "end")) == 3 and len(want) == 3 * (3 + 6)


def test_train_and_eval_iterators_with_a_monitored_session_and_the_prefetch_hook():
    want = _stock(train_eval_graph, schedule)
    with tf.Graph().as_default():
        handles = train_eval_graph()
        with ss.MonitoredTrainingSession(config=auto(), hooks=[ss.make_prefetch_hook()], targets=_targets(handles),
                                         save_summaries_steps=None, log_step_count_steps=None) as sess:
            got = schedule(functools.partial(sess.run, options=bounded()), handles)
            assert not sess.should_stop()
    assert got == want


def test_train_and_eval_iterators_with_a_plain_session_and_run_initializer():
    want = _stock(train_eval_graph, schedule)
    with tf.Graph().as_default():
        handles = train_eval_graph()
        names = {"train": [t.name for t in handles["train"]], "eval": handles["eval"].name,
                 "eval_init": handles["eval_init"].name, "init": handles["init"].name}
        meta = tf.compat.v1.train.export_meta_graph()
    result = ss.optimize(meta, auto(), targets=[names["eval"]])
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)
        with tf.compat.v1.Session() as sess:
            sess.run(names["init"])
            with ss.start_prefetch_threads(sess) as threads:
                def run(fetches):
                    if fetches == names["eval_init"]:
                        return run_initializer(sess, threads, fetches, options=bounded())
                    return sess.run(fetches, options=bounded())

                got = schedule(run, names)
        assert {d.name for d in ss.stage_defs(graph)} == {"smart_stage", "smart_stage_1"}
    assert got == want


def test_an_eval_loop_that_fetches_the_batch_itself_reads_it_synchronously():
    build = functools.partial(train_eval_graph, eval_fetches_batch=True)
    want = _stock(build, schedule)
    with tf.Graph().as_default():
        handles = build()
        with ss.Session(config=auto(), targets=_targets(handles)) as sess:
            assert [s.name for s in sess.smart_stage.stages] == ["smart_stage"]
            assert any("eval_next" in note and "fetched directly" in note for note in sess.smart_stage.notes)
            sess.run(handles["init"])
            got = schedule(functools.partial(sess.run, options=bounded()), handles)
    assert got == want


# -- two input pipelines joined in the model -----------------------------------------------------------


def two_pipelines_graph():
    """Two one-shot iterators of different lengths, joined: the shorter one ends the input.

        next_a (0..19)      -> a * 10 --\\
                                          concat -> loss(w)
        next_b (100..113)   -> b - 1  --/
    """
    a = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(20).batch(2)).get_next(name="next_a")
    b = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(100, 114).batch(2)).get_next(name="next_b")
    loss, step = _sum_loss(tf.concat([a * 10, b - 1], axis=0) * tf.concat([a, b], axis=0), "joined")
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, step)
    return {"train": [loss, step], "init": tf.compat.v1.global_variables_initializer()}


def run_to_the_end(run, handles):
    seen = []
    while True:
        try:
            seen.append(float(run(handles["train"])[0]))
        except tf.errors.OutOfRangeError:
            return seen


def test_two_input_pipelines_joined_in_the_model_get_a_stage_each_and_end_with_the_shorter():
    want = _stock(two_pipelines_graph, run_to_the_end)
    assert len(want) == 7
    with tf.Graph().as_default():
        handles = two_pipelines_graph()
        with ss.Session(config=auto(capacity=4)) as sess:
            assert sorted(s.name for s in sess.smart_stage.stages) == ["smart_stage", "smart_stage_1"]
            sess.run(handles["init"])
            got = run_to_the_end(functools.partial(sess.run, options=bounded()), handles)
            # After the end, the stages stay closed: the next step ends again, it does not hang.
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(handles["train"], options=bounded())
    assert got == want


# -- end of input, re-initialisation, re-created sessions ----------------------------------------------


def epochs_graph():
    """An initializable iterator over 0..9 in batches of 2 (5 batches an epoch)."""
    it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(10).batch(2))
    loss, step = _sum_loss(it.get_next(name="next") * 3, "epochs")
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, step)
    return {"train": [loss, step], "iterator_init": it.initializer,
            "init": tf.compat.v1.global_variables_initializer()}


def epochs(run, handles, cut_short=(2, None, 1, None)):
    """One epoch per entry: re-initialise, then run `n` steps (None: until the end of input)."""
    seen = []
    for n in cut_short:
        run(handles["iterator_init"])
        batch = []
        while n is None or len(batch) < n:
            try:
                batch.append(float(run(handles["train"])[0]))
            except tf.errors.OutOfRangeError:
                batch.append("end")
                break
        seen.append(batch)
    return seen


EPOCHS_WANT = [[3.0, 15.0], [3.0, 15.0, 27.0, 39.0, 51.0, "end"], [3.0], [3.0, 15.0, 27.0, 39.0, 51.0, "end"]]


@pytest.mark.parametrize("num_threads", [1, 2])
def test_epochs_in_one_ss_session_never_serve_a_stale_lost_or_repeated_batch(num_threads):
    assert _stock(epochs_graph, epochs) == EPOCHS_WANT
    with tf.Graph().as_default():
        handles = epochs_graph()
        with ss.Session(config=auto(capacity=3, num_threads=num_threads)) as sess:
            sess.run(handles["init"])
            got = epochs(functools.partial(sess.run, options=bounded()), handles)
    if num_threads == 1:
        assert got == EPOCHS_WANT
    else:  # two prefetch threads may swap neighbouring batches; each epoch still has each batch once
        assert [sorted(e, key=str) for e in got] == [sorted(e, key=str) for e in EPOCHS_WANT]


def test_epochs_in_one_monitored_session_with_the_prefetch_hook():
    with tf.Graph().as_default():
        handles = epochs_graph()
        # The Scaffold's local init runs the initializer before the hook starts the threads.
        scaffold = tf.compat.v1.train.Scaffold(local_init_op=handles["iterator_init"])
        with ss.MonitoredTrainingSession(config=auto(), scaffold=scaffold, hooks=[ss.make_prefetch_hook()],
                                         save_summaries_steps=None, log_step_count_steps=None) as sess:
            got = epochs(functools.partial(sess.run, options=bounded()), handles)
    assert got == EPOCHS_WANT


def test_an_initializer_run_behind_the_runtimes_back_fails_the_next_step_instead_of_serving_stale_batches():
    with tf.Graph().as_default():
        handles = epochs_graph()
        meta = tf.compat.v1.train.export_meta_graph()
        names = {k: v.name if not isinstance(v, list) else [t.name for t in v] for k, v in handles.items()}
    result = ss.optimize(meta, auto(capacity=3))
    with tf.Graph().as_default():
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def)
        with tf.compat.v1.Session() as sess:
            sess.run([names["init"], names["iterator_init"]])
            with ss.start_prefetch_threads(sess) as threads:
                assert sess.run(names["train"], options=bounded())[0] == 3.0
                sess.run(names["iterator_init"])  # a plain run: the runtime does not see it
                with pytest.raises(tf.errors.InvalidArgumentError, match="re-.?initialised"):
                    sess.run(names["train"], options=bounded())
                # Through the runtime, the stage is emptied and refilled: the new epoch starts at its start.
                run_initializer(sess, threads, names["iterator_init"])
                assert sess.run(names["train"], options=bounded())[0] == 3.0
                assert sess.run(names["train"], options=bounded())[0] == 15.0


def test_a_step_before_the_iterator_is_initialised_fails_at_once():
    with tf.Graph().as_default():
        handles = epochs_graph()
        with ss.Session(config=auto()) as sess:
            sess.run(handles["init"])
            # Stock TensorFlow raises FailedPrecondition; the stage's guard says what to do instead of hanging.
            with pytest.raises(tf.errors.InvalidArgumentError, match="never initialised"):
                sess.run(handles["train"], options=bounded())
            sess.run(handles["iterator_init"])
            assert sess.run(handles["train"], options=bounded())[0] == 3.0


def test_end_of_input_reaches_the_step_after_every_buffered_batch():
    def build():
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(9).batch(2)).get_next(name="next")
        loss, step = _sum_loss(x, "end")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, step)
        return {"train": [loss, step], "init": tf.compat.v1.global_variables_initializer()}

    want = _stock(build, run_to_the_end)
    assert want == [1.0, 5.0, 9.0, 13.0, 8.0]  # the last, smaller batch too
    with tf.Graph().as_default():
        handles = build()
        with ss.Session(config=auto(capacity=8)) as sess:  # the whole input fits in the stage
            sess.run(handles["init"])
            got = run_to_the_end(functools.partial(sess.run, options=bounded()), handles)
    assert got == want


def test_a_new_session_on_the_same_graph_starts_the_input_over_as_stock_does():
    with tf.Graph().as_default():
        handles = epochs_graph()
        runs = []
        for _ in range(2):
            with ss.Session(config=auto()) as sess:
                sess.run(handles["init"])
                runs.append(epochs(functools.partial(sess.run, options=bounded()), handles, cut_short=(3,)))
    assert runs == [[[3.0, 15.0, 27.0]]] * 2


class _AbortOnce(tf.compat.v1.train.SessionRunHook):
    """Raises AbortedError from the step after `after` steps, once: the MonitoredSession re-creates its session."""

    def __init__(self, after: int):
        self.after, self.steps, self.aborted = after, 0, False

    def after_run(self, run_context, run_values):
        self.steps += 1
        if self.steps == self.after and not self.aborted:
            self.aborted = True
            raise tf.errors.AbortedError(None, None, "injected abort")


def _recovering(session_factory, hooks):
    with tf.Graph().as_default():
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(40).batch(2)).get_next(name="next")
        loss, step = _sum_loss(x, "recreate")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, step)
        abort = _AbortOnce(after=3)
        seen = []
        with session_factory(hooks=[abort, *hooks], save_summaries_steps=None, log_step_count_steps=None) as sess:
            for _ in range(6):
                seen.append(float(sess.run([loss, step], options=bounded())[0]))
        assert abort.aborted
        return seen


def test_a_monitored_session_re_created_after_an_abort_runs_as_stock_does():
    want = _recovering(tf.compat.v1.train.MonitoredTrainingSession, [])
    got = _recovering(functools.partial(ss.MonitoredTrainingSession, config=auto()), [ss.make_prefetch_hook()])
    assert got == want
    # The aborted third step is retried on the new session, whose one-shot iterator starts over.
    assert want == [1.0, 5.0, 1.0, 5.0, 9.0, 13.0]


def test_a_hand_placed_stage_and_an_inserted_one_in_one_live_graph():
    def build():
        a = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(20).batch(2)).get_next(name="next_a")
        b = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(50, 70).batch(2)).get_next(name="next_b")
        a = ss.staged(a + 1, num_threads=1)  # covers next_a; next_b gets a stage of its own
        loss, step = _sum_loss((a * 2) * (b - 3), "mixed")  # a * 2 moves behind one stage, b - 3 the other
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, step)
        return {"train": [loss, step], "init": tf.compat.v1.global_variables_initializer()}

    with tf.Graph().as_default():  # stock TensorFlow, with the hand-placed stage as it was built
        handles = build()
        with tf.compat.v1.Session() as sess:
            sess.run(handles["init"])
            with ss.start_prefetch_threads(sess):
                want = run_to_the_end(functools.partial(sess.run, options=bounded()), handles)
    with tf.Graph().as_default():
        handles = build()
        with ss.Session(config=auto()) as sess:
            assert sorted(s.name for s in sess.smart_stage.stages) == ["smart_stage", "stage"]
            sess.run(handles["init"])
            got = run_to_the_end(functools.partial(sess.run, options=bounded()), handles)
    assert got == want and len(want) == 10


def _deeprec_automatic_example(data_path, deeprec_flag: bool):
    """DeepRec's "Automatically SmartStage" example (docs/docs_en/Smart-Stage.md), ported by its import.
    Returns 5 steps of `target` and the session's SmartStage record."""
    from smartstage.compat import tf as dtf

    with tf.Graph().as_default():
        dataset = tf.data.TextLineDataset(data_path).batch(2).map(
            lambda value: tf.io.decode_csv(value, record_defaults=[[""], [""]]), num_parallel_calls=2)
        iterator = tf.compat.v1.data.Iterator.from_structure(tf.compat.v1.data.get_output_types(dataset),
                                                             tf.compat.v1.data.get_output_shapes(dataset))
        xx = list(iterator.get_next())
        init_op = iterator.make_initializer(dataset)
        var = dtf.get_variable("var", shape=[100, 3], initializer=dtf.ones_initializer())
        xx[0] = dtf.string_to_hash_bucket(xx[0], num_buckets=10)
        xx[0] = dtf.nn.embedding_lookup(var, xx[0])
        xx[1] = dtf.concat([xx[1], ["xxx"]], axis=0)
        target = dtf.concat([dtf.as_string(xx[0]), [xx[1], xx[1]]], 0)
        config = dtf.ConfigProto()
        if deeprec_flag:
            config.graph_options.optimizer_options.do_smart_stage = True
            config.graph_options.optimizer_options.smart_stage_options.CopyFrom(
                dtf.SmartStageOptions(capacity=1, num_threads=1))
        dtf.train.mark_target_node([target])
        scaffold = dtf.train.Scaffold(local_init_op=dtf.group(dtf.local_variables_initializer(), init_op))
        with dtf.train.MonitoredTrainingSession(config=config, scaffold=scaffold, hooks=[dtf.make_prefetch_hook()],
                                                save_summaries_steps=None, log_step_count_steps=None) as sess:
            return [sess.run([target], options=bounded())[0].tolist() for _ in range(5)], sess.smart_stage


def test_deeprecs_automatic_smart_stage_example_runs_unchanged_but_for_its_import(tmp_path):
    data = examples.write_deeprec_example_data(tmp_path / "test_data.csv")
    want, _ = _deeprec_automatic_example(data, deeprec_flag=False)
    got, record = _deeprec_automatic_example(data, deeprec_flag=True)
    assert got == want
    (stage,) = record.stages
    assert stage.name == "smart_stage" and set(stage.moved) >= {"StringToHashBucket", "concat"}


def test_a_monitored_session_without_the_prefetch_hook_is_refused_when_auto_stage_inserts_a_stage():
    with tf.Graph().as_default():
        epochs_graph()
        with pytest.raises(ss.StageRuntimeError, match="no prefetch hook"):
            ss.MonitoredTrainingSession(config=auto(), save_summaries_steps=None, log_step_count_steps=None)
