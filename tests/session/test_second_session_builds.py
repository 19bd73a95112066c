"""A second session of the same graph (evaluation after training) reuses what the first built: the lane ops
(the graph gains no op), the rewrite, and it builds at most the executors its producer needs, flag on as off.

Executors belong to a TensorFlow session, so every session builds its producer's again (runtime/lanes/producers/
callables.py). With shared lanes (one body copy, every run fed its ticket) that is three fetch lists whatever
the lanes: the head's hand-in, the body and the merger's move; the put is never run, since its executor would
hold the same head and body a second time (with the flag on, the moved work: on the Wide&Deep look-alike
1.1 s of CPU per session). What a session builds is exactly that list, each once, and nothing else (no put,
no second fetch list per lane, no byte-measuring run of its own), counted by the producer's own
ProducerRuns.builds; the values are the flag-off run's, step by step.
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
    """The one-lane put's fetch list (through run()), which shared lanes never build."""
    return (producer.lanes.put_occupancy.name, producer.lanes.batch_bytes.name)


def _needed(producer) -> set[tuple[str, ...]]:
    """Every fetch list the ordered producer of 4 shared lanes needs executors for (names, in order)."""
    lanes = producer.lanes
    targets = (lanes.head_targets.name,) if lanes.head_targets is not None else ()
    needed = set()
    for index, lane in enumerate(lanes.lanes):
        needed.add((lane.occupancy.name,))
        needed.add((lane.hand_in.name, *targets))
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
                "needed": _needed(producer), "lanes": len(producer.lanes.lanes), "put": _put(producer),
                "shared": (first_producer.shared, producer.shared)}


@pytest.fixture(scope="module")
def flag_off() -> dict:
    return _two_sessions(False)


@pytest.mark.parametrize("on", [False, True])
def test_a_second_session_builds_only_its_producers_executors_and_keeps_the_values(on, flag_off):
    got = _two_sessions(True) if on else flag_off
    assert got["ops_grown"] == 0   # the lanes (and the rewrite) of the first session are found, not rebuilt
    assert got["lanes"] == LANES and got["shared"] == (True, True)
    assert len(got["needed"]) == 3  # hand-in, body and move: one fetch list each for every lane
    assert got["made"] == got["needed"], (got["made"], got["needed"])  # the put's is not among them
    assert got["put"] not in got["made"]
    assert got["builds"] == (3, 3)  # each built once per session, the first as the second
    assert got["builds"][1] <= flag_off["builds"][1]  # flag on builds no more executors than flag off
    np.testing.assert_array_equal(got["losses"], flag_off["losses"])
