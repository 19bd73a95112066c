"""A checkpoint restore trains every record exactly once: a job SIGKILLed after a checkpoint, then resumed.

    kill job:    steps 1..33, checkpoints at 0, 10, 20, 30 (the iterator's position in SAVEABLE_OBJECTS), SIGKILL
    resume job:  restores step 30 and the iterator, trains to the end of input
    counted:     the ids the kill job's steps 1..30 trained + the ids the resume job trained == each id once

A folded tf.data stage (the default, tf_data_stage="fold", flag on and off) restores exactly, as plain
`dataset.prefetch` does: its buffer is tf.data's, saved with the position. Lanes (`tf_data_stage="lanes"`)
restore as stock queues do: the iterator's position is past what the buffer held, and those records are
lost; the test asserts that too, so the count is shown to catch a loss.
"""

from __future__ import annotations

import pytest

from tests.runtime.restore_counts import kill_and_resume


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


@pytest.mark.parametrize("mode, threads, capacity", [("off", 4, 40), ("on", 1, 4)])
def test_lanes_lose_what_their_buffer_held(tmp_path, mode, threads, capacity):
    counts = kill_and_resume(tmp_path, mode=mode, threads=threads, capacity=capacity, tf_data_stage="lanes")
    assert counts.resumed_ended and counts.repeated == [], counts.describe()
    # The buffer held at least `capacity` batches of 4 records ahead of the checkpointed step.
    assert len(counts.lost) >= 4 * min(capacity, 4), counts.describe()
