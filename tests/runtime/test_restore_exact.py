"""A checkpoint restore trains every record exactly once: a job SIGKILLed after a checkpoint, then resumed.

    kill job:    steps 1..33, checkpoints at 0, 10, 20, 30 (the iterator's position in SAVEABLE_OBJECTS), SIGKILL
    resume job:  restores step 30 and the iterator, trains to the end of input
    counted:     the ids the kill job's steps 1..30 trained + the ids the resume job trained == each id once

A folded tf.data stage (the default, tf_data_stage="fold", flag on and off, and in a stock
MonitoredTrainingSession whose make_prefetch_hook() folds it in begin()) restores exactly, as plain
`dataset.prefetch` does: its buffer is tf.data's, saved with the position. Lanes (`tf_data_stage="lanes"`)
restore as stock queues do: the iterator's position is past what the buffer held, and those records are
lost; the test asserts that too, so the count is shown to catch a loss.
"""

from __future__ import annotations

import pytest

from tests.runtime.restore_counts import kill_and_resume

pytestmark = pytest.mark.slow  # runs benchmarks or training jobs in subprocesses: started first (tests/conftest.py)


def _assert_exact(counts) -> None:
    assert counts.resumed_ended, "the resumed job did not reach the end of input"
    assert counts.restored_step >= 30, counts.describe()
    assert counts.lost == [] and counts.repeated == [], counts.describe()


def test_plain_prefetch_restores_every_record_once(tmp_path):
    _assert_exact(kill_and_resume(tmp_path, mode="prefetch", threads=4, capacity=40))


@pytest.mark.parametrize("capacity", [4, 40])
@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("mode", ["off", "on"])
def test_folded_stage_restores_every_record_once(tmp_path, mode, threads, capacity):
    _assert_exact(kill_and_resume(tmp_path, mode=mode, threads=threads, capacity=capacity))


@pytest.mark.parametrize("capacity", [4, 40])
@pytest.mark.parametrize("threads", [1, 4])
def test_stock_session_with_the_prefetch_hook_restores_every_record_once(tmp_path, threads, capacity):
    _assert_exact(kill_and_resume(tmp_path, mode="off", threads=threads, capacity=capacity, session="stock"))


@pytest.mark.parametrize("mode, threads, capacity, session", [
    ("off", 4, 40, "smartstage"), ("on", 1, 4, "smartstage"), ("off", 4, 40, "stock")])
def test_lanes_lose_what_their_buffer_held(tmp_path, mode, threads, capacity, session):
    counts = kill_and_resume(tmp_path, mode=mode, threads=threads, capacity=capacity, tf_data_stage="lanes",
                             session=session)
    assert counts.resumed_ended and counts.repeated == [], counts.describe()
    # The buffer held at least one batch of 4 records ahead of the checkpointed step (it fills while the
    # checkpoint is written), and the restore skips whole batches.
    assert len(counts.lost) >= 4 and len(counts.lost) % 4 == 0, counts.describe()


def _chain(tmp_path, mode: str, tf_data_stage: str = "") -> tuple[list[int], int]:
    """One process: train 33 steps (checkpoint at the end), evaluate in a session of its own that restores it,
    then train from the checkpoint to the end of input; every record id the two training sessions trained."""
    import argparse

    import tensorflow as tf

    import smartstage as ss
    from tests.runtime import restore_job
    from tests.runtime.helpers import bounded

    args = argparse.Namespace(mode=mode, threads=4, capacity=8, records=200, batch=4, tf_data_stage=tf_data_stage)
    trained: list[int] = []
    graph = tf.Graph()
    with graph.as_default():
        trained_ids, step_after, iterator = restore_job.build(args)
        weights = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"][0]
        scaffold = tf.compat.v1.train.Scaffold(
            init_op=tf.group(tf.compat.v1.global_variables_initializer(), iterator.initializer),
            local_init_op=tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer()))
        checkpoints = str(tmp_path / "ckpt")

        def train(steps: int | None) -> None:
            with ss.MonitoredTrainingSession(checkpoint_dir=checkpoints, scaffold=scaffold,
                                             hooks=[ss.make_prefetch_hook()], config=restore_job._config(args),
                                             save_checkpoint_steps=1000, save_checkpoint_secs=None,
                                             save_summaries_steps=None, save_summaries_secs=None,
                                             log_step_count_steps=None) as sess:
                while not sess.should_stop() and (steps is None or steps > 0):
                    ids, _ = sess.run([trained_ids, step_after], options=bounded())
                    trained.extend(int(i) for i in ids)
                    steps = None if steps is None else steps - 1

        train(33)    # the checkpoint hook saves step 33 when the session closes
        saved = tf.train.latest_checkpoint(checkpoints)
        with ss.Session(graph=graph, config=restore_job._config(args)) as evaluation:
            scaffold.saver.restore(evaluation, saved)
            evaluated = evaluation.run(weights)
        train(None)  # restores step 33 and the iterator, trains to the end of input
        with ss.Session(graph=graph, config=restore_job._config(args)) as evaluation:
            scaffold.saver.restore(evaluation, tf.train.latest_checkpoint(checkpoints))
            assert (evaluation.run(weights) != evaluated).any()   # the second training session trained from it
    return trained, args.records


@pytest.mark.parametrize("mode", ["off", "on"])
def test_sessions_of_one_graph_restore_each_other_exactly(tmp_path, mode):
    trained, records = _chain(tmp_path, mode)
    assert sorted(trained) == list(range(records))


def test_sessions_of_one_graph_on_lanes_lose_what_the_buffer_held(tmp_path):
    trained, records = _chain(tmp_path, "off", tf_data_stage="lanes")
    assert len(set(trained)) == len(trained) and len(trained) < records
