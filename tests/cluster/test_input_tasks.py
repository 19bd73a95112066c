"""Scale-out on a loopback cluster: a trainer and 1-4 input tasks, each in its own process.

    central: the trainer reads, the tasks compute the body    -> every step identical to the unoptimized graph
    sharded: task i reads shard i of the rows                 -> round-robin over tasks, every row exactly once
    failure: input task 1 is killed mid-run                   -> InputTaskError naming it, within the bound
"""

from __future__ import annotations

import time

import pytest

from tests.bounds import JOB_HANG_SECONDS
from tests.cluster import graphs
from tests.cluster.cluster import LoopbackCluster, report, wait_for

pytestmark = [pytest.mark.cluster]

BOUND_SECONDS = JOB_HANG_SECONDS


def train_on_cluster(tmp_path, tasks: int, mode: str, *extra: str) -> dict:
    with LoopbackCluster(tasks) as cluster:
        return report(cluster.trainer(mode, str(tasks), str(tmp_path), *extra), BOUND_SECONDS)


def expected_sharded_rows(rows: int, batch: int, tasks: int) -> list[list[int]]:
    """Task t's rows t, t+N, ... in batches; the tasks' batches taken in turn, a finished task leaving the turn."""
    per_task = [[r for r in range(t, rows, tasks)] for t in range(tasks)]
    batches = [[shard[i:i + batch] for i in range(0, len(shard), batch)] for shard in per_task]
    order, turn = [], 0
    while any(batches):
        if batches[turn % tasks]:
            order.append(batches[turn % tasks].pop(0))
        turn += 1
    return order


@pytest.mark.parametrize("tasks", [1, 2, 4])
def test_central_source_every_step_identical_to_the_unoptimized_graph(tmp_path, tasks):
    seen = report_central = train_on_cluster(tmp_path, tasks, "central")
    assert any("task:0" in d for d in seen["devices"]), seen["devices"]
    if tasks > 1:
        assert any(f"/job:input/replica:0/task:{tasks - 1}" in d for d in seen["devices"]), seen["devices"]
    assert seen["error"] is None, seen["error"]
    reference = report_central["reference"]
    assert len(reference) == -(-graphs.ROWS // graphs.BATCH)
    assert seen["steps"] == reference  # losses and row ids, step by step, bit for bit


@pytest.mark.parametrize("tasks", [2, 4])
def test_sharded_sources_round_robin_every_row_once(tmp_path, tasks):
    seen = train_on_cluster(tmp_path, tasks, "sharded")
    assert seen["error"] is None, seen["error"]
    rows = [step[1] for step in seen["steps"]]
    assert rows == expected_sharded_rows(graphs.ROWS, graphs.BATCH, tasks)
    assert sorted(r for batch in rows for r in batch) == list(range(graphs.ROWS))


@pytest.mark.parametrize("mode", ["central", "sharded"])
def test_a_killed_input_task_fails_the_trainer_naming_it(tmp_path, mode):
    with LoopbackCluster(2) as cluster:
        trainer = cluster.trainer(mode, "2", str(tmp_path), "--kill-after", "3", "--rows", "100000",
                                  "--slow-millis", "20")
        wait_for(tmp_path / "kill", BOUND_SECONDS)
        cluster.inputs[1].kill()
        killed_at = time.monotonic()
        seen = report(trainer, BOUND_SECONDS)
    error = seen["error"]
    assert error is not None and error["type"] == "InputTaskError", error
    assert "/job:input/replica:0/task:1" in error["message"] and error["task"].endswith("task:1"), error
    # the kill is what failed the step, not a step's deadline (the hang bound of every step run)
    assert seen["error_at"] - killed_at < graphs.STEP_MILLIS / 1000
    assert len(seen["steps"]) >= 3
