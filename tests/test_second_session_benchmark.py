"""benchmarks.second_session runs end to end in its smallest mode, so it keeps working.

    python -m benchmarks.second_session --smoke    # wide_and_deep, flag off and on, 1 repeat, 4 steps

It runs in a subprocess (each run is a process of its own, the benchmarks set process-wide TensorFlow state).
The timings are not checked, only that every session of both runs produced them, that the evaluation's
values are identical flag off and on, and what the stage's producer built: nothing, in the training session
as in the evaluation (the stage folds into its dataset, flag off and on).
"""

from __future__ import annotations

import json

import pytest

from tests.benchmark_runs import SMOKE_SECONDS, run_benchmark

pytestmark = pytest.mark.slow  # runs benchmarks or training jobs in subprocesses: started first (tests/conftest.py)


def test_second_session_smoke_measures_both_sessions_of_both_runs(tmp_path):
    run_benchmark("second_session", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["second_session"])
    result = json.loads((tmp_path / "second_session-latest.json").read_text())
    assert not result["errors"] and result["identical"] == [True]
    for run in ("off", "on"):
        for session in ("train", "eval"):
            got = result["measured"][run][session]
            assert got["wall"][0] > 0 and got["cpu"][0] > 0, (run, session)
            # the stage is folded into its dataset, flag on and off: no producer of ours builds anything
            assert got["builds"] == [0], (run, session, got["builds"])
    assert result["ops"]["on"] > result["ops"]["off"]  # the rewrite's graph
    text = (tmp_path / "second_session-latest.md").read_text()
    assert "| wide_and_deep | on / off |" in text and "identical in every repeat" in text
