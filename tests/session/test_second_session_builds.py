"""A second session of the same graph (evaluation after training) reuses what the first built: the lane ops
(the graph gains no op), the rewrite, and it builds at most the executors its producer needs, flag on as off.

Executors belong to a TensorFlow session, so every session builds its producer's again (runtime/lanes/producers/
callables.py). With k lanes that is the head's run (one fetch list for every lane), each lane's fed body run
and each lane's move, plus the one-lane put that worker 0 runs while the lanes build theirs. What a session
builds is exactly that list, each once, and nothing else (no second fetch list per lane, no byte-measuring
run of its own), counted by the producer's own ProducerRuns.builds; the values are the flag-off run's, step
by step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.session.monitored import MonitoredTrainingSession
from tests.runtime.helpers import lanes_config
from tests.session.graphs import bounded, small_model

STEPS = 8
LANES = 4


def _put(producer) -> tuple[str, ...]:
    """The one-lane put's fetch list (through run())."""
    return (producer.lanes.put_occupancy.name, producer.lanes.batch_bytes.name)


def _needed(producer) -> set[tuple[str, ...]]:
    """Every fetch list the ordered producer of 4 lanes needs executors for besides the put (names, in order)."""
    lanes = producer.lanes
    targets = (lanes.head_targets.name,) if lanes.head_targets is not None else ()
    needed = {(*(t.name for t in lanes.split.cut), *targets)}
    for index, lane in enumerate(lanes.lanes):
        needed.add((lane.occupancy.name,))
        needed.add(tuple(f.name for f in producer._body_fetches(index)))  # noqa: SLF001
    return needed


def _session(graph, model, on: bool) -> tuple[list, object]:
    hook = ss.make_prefetch_hook()
    # the stage on lanes (tf_data_stage="lanes"): their executors are what is counted
    with MonitoredTrainingSession(config=lanes_config(on), hooks=[hook]) as sess:
        losses = [sess.run([model.loss, model.train_op], options=bounded())[0] for _ in range(STEPS)]
        producer = hook.threads._stages[0].producer  # noqa: SLF001
    return losses, producer


def _two_sessions(on: bool) -> dict:
    graph = tf.Graph()
    with graph.as_default():
        model = small_model(num_threads=LANES, capacity=8)
        first, first_producer = _session(graph, model, on)
        ops = len(graph.get_operations())
        second, producer = _session(graph, model, on)
        made = {names for names, *_ in producer.runs._callables} | producer.runs._run_signatures  # noqa: SLF001
        return {"losses": first + second, "ops_grown": len(graph.get_operations()) - ops,
                "builds": (first_producer.runs.builds, producer.runs.builds), "made": made,
                "needed": _needed(producer), "lanes": len(producer.lanes.lanes), "put": _put(producer)}


@pytest.fixture(scope="module")
def flag_off() -> dict:
    return _two_sessions(False)


@pytest.mark.parametrize("on", [False, True])
def test_a_second_session_builds_only_its_producers_executors_and_keeps_the_values(on, flag_off):
    got = _two_sessions(True) if on else flag_off
    assert got["ops_grown"] == 0   # the lanes (and the rewrite) of the first session are found, not rebuilt
    assert got["lanes"] == LANES
    assert len(got["needed"]) == 1 + 2 * LANES  # the head, and each lane's body and move
    assert got["needed"] <= got["made"] <= got["needed"] | {got["put"]}, (got["made"], got["needed"])
    assert got["builds"][1] == len(got["made"])  # each built once
    assert len(got["needed"]) <= got["builds"][0] <= len(got["needed"]) + 1  # the first session as the second
    np.testing.assert_array_equal(got["losses"], flag_off["losses"])
