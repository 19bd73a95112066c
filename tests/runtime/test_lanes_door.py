"""The lanes behind one door: a session whose every stage folded starts no SmartStage thread and never imports
the lanes room (smartstage.runtime.lanes); a stage left on lanes goes through the door and does.

    folded:  range(n) -> iterator -> GetNext -> [*3, hash] -> staged() -> step   (ss.Session, flag off or on)
             -> the map runs in tf.data: threads of ours 0, smartstage.runtime.lanes not in sys.modules
    lanes:   the same graph, tf_data_stage="lanes" -> prefetch threads of ours, the room imported

Each case runs in a fresh interpreter: another test's imports would put the room into this one's sys.modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bounds import JOB_HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]

# Runs in the child: builds the staged graph, runs STEPS steps in an ss.Session, prints what it saw as JSON.
CHILD = r"""
import json, sys, threading
import tensorflow as tf
import smartstage as ss

on, mode, session_kind = sys.argv[1] == "on", sys.argv[2], sys.argv[3]
ROOM = "smartstage.runtime.lanes"
STEPS = 6

def ours():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("smartstage"))

config = tf.compat.v1.ConfigProto()
entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
entry.parameter_map["do_smart_stage"].b = on
entry.parameter_map["tf_data_stage"].s = mode.encode()
graph = tf.Graph()
with graph.as_default():
    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(10**6))
    x = iterator.get_next()
    features = ss.staged({"x": x * 3, "bucket": tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), 10)},
                         capacity=4, num_threads=2)
    y = features["x"] + features["bucket"] * 0
    before = ours()
    options = tf.compat.v1.RunOptions(timeout_in_ms=60000)
    if session_kind == "session":
        with ss.Session(graph=graph, config=config) as sess:
            sess.run(iterator.initializer)
            got = [int(sess.run(y, options=options)) for _ in range(STEPS)]
            during = ours()
            stages = [d.name for d in ss.stage_defs(graph)]
            room_loaded = ROOM in sys.modules
    else:
        scaffold = tf.compat.v1.train.Scaffold(local_init_op=iterator.initializer)
        with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()], scaffold=scaffold, config=config) as sess:
            got = [int(sess.run(y, options=options)) for _ in range(STEPS)]
            during = ours()
            stages = [d.name for d in ss.stage_defs(graph)]
            room_loaded = ROOM in sys.modules
print(json.dumps({"before": before, "during": during, "stages": stages, "room": room_loaded, "got": got}))
"""


def _run(on: bool, mode: str, session_kind: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, "on" if on else "off", mode, session_kind], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=JOB_HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("session_kind", ["session", "monitored"])
@pytest.mark.parametrize("on", [False, True])
def test_a_session_whose_stages_all_folded_starts_no_thread_and_leaves_the_lanes_unimported(on, session_kind):
    seen = _run(on, "fold", session_kind)
    assert seen["stages"] == []                      # the stage folded into its dataset
    assert seen["before"] == [] and seen["during"] == []
    assert seen["room"] is False
    assert seen["got"] == [0, 3, 6, 9, 12, 15]       # input order


@pytest.mark.parametrize("session_kind", ["session", "monitored"])
def test_a_stage_left_on_lanes_goes_through_the_door(session_kind):
    # The check above can fail: the same graph kept on lanes imports the room and runs threads of ours.
    seen = _run(False, "lanes", session_kind)
    assert seen["stages"] == ["stage"]
    assert seen["room"] is True
    assert seen["during"] and all(name.startswith("smartstage-prefetch") for name in seen["during"])
    assert seen["got"] == [0, 3, 6, 9, 12, 15]
