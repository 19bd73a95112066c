"""A split dataset checkpoints as tf.data's own map does: a TF2 custom loop that saves `iter(split.dataset)` with
tf.train.Checkpoint, SIGKILLed 3 steps after a checkpoint and resumed from it, trains every record exactly once
(tests/tf2/restore_loop.py; the moved work reads a read-only table), at 1 and 4 map threads.

    before:  tf.train.Checkpoint(iterator=iter(split.dataset)).save(...)   # FailedPrecondition: StatefulPartitionedCall
    after:   the save works; kill, restore: 400 of 400 records trained once
"""

from __future__ import annotations

import pytest

from tests.runtime.restore_counts import kill_and_resume_job


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 4])
def test_a_split_custom_loop_killed_and_restored_trains_every_record_once(threads, tmp_path):
    counts = kill_and_resume_job(tmp_path / f"threads{threads}", "tests.tf2.restore_loop",
                                 ("--threads", str(threads)))
    assert counts.resumed_ended and counts.killed_steps > counts.restored_step >= 30
    assert counts.lost == [] and counts.repeated == [], counts.describe()
    assert sorted(counts.trained) == list(range(400))
