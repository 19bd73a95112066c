"""A DLRM-like training script: the flag changes nothing but speed, and checkpoints interchange.

    script(on):  build_dlrm(stage_fn=staged, one prefetch thread)
                 ss.MonitoredTrainingSession(config=flag(on), checkpoint_dir=..., hooks=[prefetch hook])
                 50 x sess.run([loss, train_op])
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.examples.data import prepare_criteo
from smartstage.examples.dlrm import build_dlrm
from tests.session.graphs import flag

STEPS = 50
MORE = 5


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    return prepare_criteo(tmp_path_factory.mktemp("criteo"), num_rows=1000, seed=0, vocabulary_max_size=50)


def train(criteo, on: bool, steps: int, checkpoint_dir: str):
    """Runs the training script; returns (losses, variable values right after the session was created,
    the session's SmartStage record)."""
    with tf.Graph().as_default():
        model = build_dlrm(criteo.data_path, criteo.vocabulary_paths,
                           stage_fn=functools.partial(ss.staged, num_threads=1))
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        losses = []
        with ss.MonitoredTrainingSession(config=flag(on), checkpoint_dir=checkpoint_dir, save_summaries_steps=None,
                                         log_step_count_steps=None, hooks=[ss.make_prefetch_hook()]) as sess:
            restored = sess.run(variables)
            while len(losses) < steps:
                losses.append(sess.run([model.loss, model.train_op])[0])
        return np.array(losses), restored, sess.smart_stage


def checkpoint_values(directory: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(directory)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def runs(criteo, tmp_path_factory):
    without = str(tmp_path_factory.mktemp("without_flag"))
    with_flag = str(tmp_path_factory.mktemp("with_flag"))
    return {"off": train(criteo, False, STEPS, without), "on": train(criteo, True, STEPS, with_flag),
            "dirs": {"off": without, "on": with_flag}}


def test_losses_are_identical_for_50_steps_with_and_without_the_flag(runs):
    off, _, off_record = runs["off"]
    on, _, on_record = runs["on"]
    assert (off_record is None or all(s.folded_into for s in off_record.stages)) and on_record is not None \
        and on_record.changed  # flag off: a tf.data stage is folded, nothing else changes
    (stage,) = on_record.stages
    assert len(stage.moved) > 50, "the DLRM preprocessing moved behind the stage"
    assert len(off) == len(on) == STEPS and len(set(off.tolist())) > 1
    np.testing.assert_array_equal(off, on)


def test_checkpoints_hold_the_same_variables_under_the_same_names(runs):
    off = checkpoint_values(runs["dirs"]["off"])
    on = checkpoint_values(runs["dirs"]["on"])
    assert set(off) == set(on)
    assert int(on["global_step"]) == STEPS
    for name in off:
        np.testing.assert_array_equal(off[name], on[name], err_msg=name)


def restore_and_train(criteo, on: bool, directory: str, steps: int):
    """Builds the script's graph, restores `directory` with a plain Saver in an ss.Session (the flag on or
    off), trains `steps` more steps; returns (restored variable values, losses, the SmartStage record)."""
    with tf.Graph().as_default() as graph:
        model = build_dlrm(criteo.data_path, criteo.vocabulary_paths,
                           stage_fn=functools.partial(ss.staged, num_threads=1))
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        saver = tf.compat.v1.train.Saver()
        local_init = tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer())
    with ss.Session(graph=graph, config=flag(on)) as sess:
        saver.restore(sess, tf.train.latest_checkpoint(directory))
        sess.run(local_init)
        restored = sess.run(variables)
        losses = [sess.run([model.loss, model.train_op])[0] for _ in range(steps)]
        return restored, np.array(losses), sess.smart_stage


def test_checkpoints_restore_into_a_graph_built_the_other_way_and_back(criteo, runs):
    trained = {}
    for written, restored in (("on", "off"), ("off", "on")):
        saved = checkpoint_values(runs["dirs"][written])
        values, losses, record = restore_and_train(criteo, restored == "on", runs["dirs"][written], MORE)
        # flag off: the stage folds into its dataset at most (nothing expands)
        assert record is not None if restored == "on" else (record is None or all(s.folded_into for s in record.stages))
        assert set(values) == set(saved)
        for name, value in values.items():
            np.testing.assert_array_equal(value, saved[name], err_msg=f"{written} -> {restored}: {name}")
        trained[restored] = losses
    # Both go on from the same state over the same batches: the flag changes nothing here either.
    assert len(trained["on"]) == MORE and np.all(np.isfinite(trained["on"]))
    np.testing.assert_array_equal(trained["on"], trained["off"])
