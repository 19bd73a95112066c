"""Helpers of the runtime tests: every wait here has a bound, so a bug fails, never hangs."""

from __future__ import annotations

import threading
import time

import pytest
import tensorflow as tf

from tests.bounds import HANG_MILLIS, HANG_SECONDS

# A main-side run that would hang because of a bug fails with DeadlineExceededError instead (tests/bounds.py).
STEP_MILLIS = HANG_MILLIS
BOUND_SECONDS = HANG_SECONDS


def bounded() -> tf.compat.v1.RunOptions:
    """RunOptions for a main-side step in a test: never waits longer than STEP_MILLIS."""
    return tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)


def wait_until(predicate, what: str, bound: float = BOUND_SECONDS) -> None:
    """Polls `predicate` until it holds; fails the test after `bound` seconds (never a speed check)."""
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {bound:.0f} s waiting for {what}")
        time.sleep(0.01)


def prefetch_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("smartstage-prefetch") and t.is_alive()]


def drain(sess, fetches, limit: int = 10000) -> list:
    """Runs `fetches` until OutOfRangeError; the results in arrival order."""
    results = []
    for _ in range(limit):
        try:
            results.append(sess.run(fetches, options=bounded()))
        except tf.errors.OutOfRangeError:
            return results
    pytest.fail(f"no end of input after {limit} steps")


def range_input(n: int) -> tf.Tensor:
    """A prefetch-side source yielding 0..n-1, then OutOfRangeError (safe for several threads)."""
    iterator = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(n))
    return iterator.get_next()


def lanes_config(on: bool = False) -> tf.compat.v1.ConfigProto:
    """A ConfigProto that keeps a tf.data stage on lanes (tf_data_stage="lanes"; "fold", the default, folds it
    into its dataset in a SmartStage session), the flag `on` or off."""
    config = tf.compat.v1.ConfigProto()
    entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
    entry.parameter_map["do_smart_stage"].b = on
    entry.parameter_map["tf_data_stage"].s = b"lanes"
    return config


class RunCounter:
    """Counts tf.compat.v1.Session.run calls (every session kind ends there) while the test runs."""

    def __init__(self, monkeypatch):
        self.calls = 0
        run = tf.compat.v1.Session.run

        def counted(session, *args, **kwargs):
            self.calls += 1
            return run(session, *args, **kwargs)

        monkeypatch.setattr(tf.compat.v1.Session, "run", counted)
