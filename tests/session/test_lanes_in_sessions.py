"""With tf_data_stage="lanes" (a tf.data stage is folded into its dataset otherwise), a stage with several
threads runs its ordered lanes in every session kind, flag on and off: the live rewrite never mistakes the
runtime's lane ops (built by the prefetch hook's begin() after the rewrite) for late main-side readers, and
the values stay those of the flag-off run."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from tests.runtime.helpers import wait_until
from tests.session.graphs import bounded, small_model

STEPS = 6


def flag(on: bool) -> tf.compat.v1.ConfigProto:
    """The flag on or off, with the tf.data stage on lanes."""
    config = tf.compat.v1.ConfigProto()
    entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
    entry.parameter_map["do_smart_stage"].b = on
    entry.parameter_map["tf_data_stage"].s = b"lanes"
    return config


def _monitored_losses(on: bool, caplog) -> tuple[list, list]:
    graph = tf.Graph()
    with graph.as_default():
        model = small_model(num_threads=4, capacity=8)
        hook = ss.make_prefetch_hook()
        with caplog.at_level(logging.WARNING, logger="smartstage"):
            with MonitoredTrainingSession(config=flag(on), hooks=[hook]) as sess:
                losses = [sess.run([model.loss, model.train_op], options=bounded())[0]]
                producer = hook.threads._stages[0].producer  # noqa: SLF001
                # the lanes build their executors while worker 0 puts: the next steps take their batches
                wait_until(lambda: all(producer._ready[1:]), "lanes 1-3's executors")  # noqa: SLF001
                losses += [sess.run([model.loss, model.train_op], options=bounded())[0] for _ in range(STEPS)]
                stats = hook.threads.stats()
    return losses, stats


@pytest.mark.parametrize("on", [False, True])
def test_monitored_session_runs_four_lanes_and_keeps_the_values(on, caplog):
    losses, stats = _monitored_losses(on, caplog)
    assert not [r for r in caplog.records if "instead of" in r.getMessage()], caplog.text
    assert stats[0].num_threads == 4 and stats[0].ordered
    assert sum(1 for n in stats[0].lane_batches if n) >= 2, stats[0].lane_batches  # several lanes produced
    reference, _ = _monitored_losses(False, caplog) if on else (losses, None)
    np.testing.assert_array_equal(losses, reference)
