"""Everything the user holds keeps working with the flag: hooks, summaries, Scaffold, iterators, savers."""

from __future__ import annotations

import glob

import numpy as np
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from tests.session.graphs import flag

STEPS = 8
ROWS = 48


def initializable_model():
    """
        initializable iterator -> stage -> dense -> scale (moves) -> mean -> summary "scaled_mean"
                                                               \\-> matmul(v) -> loss -> train
    The iterator's initializer runs through the user's Scaffold(local_init_op=...).
    """
    tf.compat.v1.set_random_seed(11)
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((ROWS, 3)).astype(np.float32)
    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(dense).batch(4))
    x = ss.staged(iterator.get_next(), num_threads=1)
    scaled = x * 0.5 + 1.0
    summary = tf.compat.v1.summary.scalar("scaled_mean", tf.reduce_mean(scaled))
    v = tf.compat.v1.get_variable("v", [3, 1], initializer=tf.compat.v1.random_uniform_initializer(seed=1))
    loss = tf.reduce_mean(tf.square(tf.matmul(scaled, v)))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
    scaffold = tf.compat.v1.train.Scaffold(
        local_init_op=tf.group(tf.compat.v1.local_variables_initializer(), iterator.initializer),
        saver=tf.compat.v1.train.Saver(max_to_keep=2))
    return train_op, loss, summary, scaffold


def summary_values(directory: str) -> dict[int, float]:
    values = {}
    for path in glob.glob(f"{directory}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "scaled_mean":
                    values[event.step] = value.simple_value
    return values


def train(on: bool, directory: str):
    with tf.Graph().as_default():
        train_op, loss, _, scaffold = initializable_model()
        hooks = [ss.make_prefetch_hook(), tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]
        losses = []
        with MonitoredTrainingSession(config=flag(on), scaffold=scaffold, hooks=hooks, checkpoint_dir=directory,
                                      save_summaries_steps=1, save_checkpoint_steps=4,
                                      log_step_count_steps=None) as sess:
            while not sess.should_stop():
                losses.append(sess.run([loss, train_op])[0])
        return np.array(losses), sess.smart_stage


def test_scaffold_iterator_summaries_checkpoints_and_stop_hook_work_with_the_flag(tmp_path):
    off_losses, off_record = train(False, str(tmp_path / "off"))
    on_losses, on_record = train(True, str(tmp_path / "on"))
    assert (off_record is None or all(s.folded_into for s in off_record.stages)) and on_record.changed
    assert "Mean" in on_record.stages[0].moved, "the summarized mean moved to the prefetch side"
    assert len(on_losses) == STEPS                              # StopAtStepHook stopped at the step
    np.testing.assert_array_equal(off_losses, on_losses)
    off_summaries, on_summaries = summary_values(str(tmp_path / "off")), summary_values(str(tmp_path / "on"))
    assert len(on_summaries) >= STEPS - 1                      # a summary of a moved tensor, every step
    assert on_summaries == off_summaries                         # of the batch being trained on
    assert tf.train.latest_checkpoint(str(tmp_path / "on")).endswith(f"-{STEPS}")
