"""Scale-out through the session flag on a loopback cluster: a trainer and 2 input tasks, each its own process.

    config = ss.enable_smart_stage(ConfigProto(cluster_def=...), input_job="input"[, input_mode="sharded"])
    ss.Session(server.target, config=config) / ss.MonitoredTrainingSession(master=server.target, config=config)

    central: every step identical to the graph without the flag; task 1 runs its copy of the body
    sharded: round-robin over the tasks' shards, every row exactly once, each task's lane its share

One trainer process (tests/cluster/session_trainer.py) runs the four combinations one after the other on
its own server; each test below checks one of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.bounds import JOB_HANG_SECONDS
from tests.cluster import graphs
from tests.cluster.cluster import REPO, LoopbackCluster, _env, report
from tests.cluster.test_input_tasks import expected_sharded_rows

pytestmark = [pytest.mark.cluster]

TASKS = 2
BOUND_SECONDS = JOB_HANG_SECONDS
TASK_0 = "/job:input/replica:0/task:0/device:CPU:0"
TASK_1 = "/job:input/replica:0/task:1/device:CPU:0"


@pytest.fixture(scope="module")
def runs() -> dict:
    with LoopbackCluster(TASKS) as cluster:
        trainer = subprocess.Popen([sys.executable, "-m", "tests.cluster.session_trainer", json.dumps(cluster.spec)],
                                   cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return report(trainer, BOUND_SECONDS)  # kills the trainer when it runs past the bound


def assert_placed_on_both_tasks(seen: dict) -> None:
    """The live graph has task 1's copies and the marker, and each lane reads one task's body."""
    assert seen["marker"], "no <stage>/input_tasks marker in the session's graph"
    assert seen["num_threads"] == TASKS, seen["num_threads"]  # one lane per task
    assert TASK_0 in seen["put_input_devices"], seen["put_input_devices"]
    assert seen["copy_devices"] == [TASK_1], seen["copy_devices"]
    assert [TASK_0 in d for d in seen["lane_input_devices"]] == [True, False], seen["lane_input_devices"]
    assert [TASK_1 in d for d in seen["lane_input_devices"]] == [False, True], seen["lane_input_devices"]


@pytest.mark.parametrize("session", ["session", "monitored"])
def test_central_mode_every_step_identical_to_the_graph_without_the_flag(runs, session):
    seen = runs[f"{session}/central"]
    reference = runs["reference"]
    assert len(reference) == -(-graphs.ROWS // graphs.BATCH)
    assert seen["steps"] == reference  # losses and row ids, step by step, bit for bit
    assert_placed_on_both_tasks(seen)
    assert all(count > 0 for count in seen["lane_batches"]) and sum(seen["lane_batches"]) == len(reference), \
        seen["lane_batches"]
    assert any("/job:input/replica:0/task:1/" in d for d in seen["traced"]), seen["traced"]
    if session == "monitored":
        assert seen["finalized"]  # the remote lanes were built before MonitoredTrainingSession finalized it


@pytest.mark.parametrize("session", ["session", "monitored"])
def test_sharded_mode_reads_every_row_once_round_robin(runs, session):
    seen = runs[f"{session}/sharded"]
    rows = [step[1] for step in seen["steps"]]
    expected = expected_sharded_rows(graphs.ROWS, graphs.BATCH, TASKS)
    assert rows == expected
    assert sorted(r for batch in rows for r in batch) == list(range(graphs.ROWS))
    assert_placed_on_both_tasks(seen)
    per_task = [len([b for b in expected if b[0] % TASKS == task]) for task in range(TASKS)]
    assert seen["lane_batches"] == per_task  # task i's lane delivered exactly its shard's batches
