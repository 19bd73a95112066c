"""The TF2 benchmark's smoke mode on every Keras model kind (benchmarks/tf2_kinds.py): each kind's three
programs measured on the CPU and on the emulated accelerator, SmartStage's losses equal to the unmodified
model's, the report's table and the plot written; the strategy benchmark's smoke (ss.tf2.fit against
model.fit under two replicas) and the routes benchmark's (fit's layer route and step route, both equal to
model.fit).

    python -m benchmarks.tf2 --smoke --kinds tf_keras_functional,tf_keras_subclassed,keras3_subclassed,keras3_featurespace
"""

from __future__ import annotations

import json

import pytest

from benchmarks.tf2_kinds import KINDS
from tests.benchmark_runs import SMOKE_SECONDS, run_benchmark

pytestmark = pytest.mark.slow  # runs benchmarks or training jobs in subprocesses: started first (tests/conftest.py)


def test_smoke_measures_every_kind_and_plots(tmp_path):
    run_benchmark("tf2", tmp_path, "--smoke", "--kinds", ",".join(KINDS),
                  quiet_seconds=SMOKE_SECONDS["tf2 --kinds"])
    result = json.loads((tmp_path / "tf2-latest.json").read_text())
    assert sorted(result["kinds"]) == sorted(KINDS) and result["settings"] == []
    for kind, settings in result["kinds"].items():
        assert [s["device_ms"] for s in settings] == [0.0, 5.0], kind
        for setting in settings:
            for program in ("in_model", "handwritten", "smartstage", "split_untimed"):
                assert setting["steps_per_second"][program]["spread"]["median"] > 0, (kind, program)
            assert setting["losses_identical"]["smartstage"] and setting["losses_identical"]["split_untimed"], kind
            assert setting["kept"].startswith(("split", "unsplit")), kind
            assert setting["boundary_tensors"] > 0, kind
    text = (tmp_path / "tf2-latest.md").read_text()
    assert "## Keras model kinds" in text and "| keras3_featurespace | accelerator (emulated, 5 ms/step) |" in text
    assert (tmp_path / "tf2-latest.png").stat().st_size > 1000


def test_strategy_smoke_compares_fit_and_model_fit_under_two_replicas(tmp_path):
    #   python -m benchmarks.tf2_strategy --smoke: two tf_keras kinds, CPU and 5 ms device, 2 replicas, with
    #   model.fit's copy as the control
    run_benchmark("tf2_strategy", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["tf2_strategy"])
    result = json.loads((tmp_path / "tf2-strategy-latest.json").read_text())
    assert [(m["kind"], m["device_ms"]) for m in result["measured"]] == [
        ("tf_keras_functional", 0.0), ("tf_keras_subclassed", 0.0), ("tf_keras_functional", 5.0),
        ("tf_keras_subclassed", 5.0)]
    for m in result["measured"]:
        assert m["losses_identical"] and m["weights_identical"] and m["moved"] > 0, m["kind"]
        assert len(m["ratios"]) == 2 and all(r > 0 for r in m["ratios"]), m["kind"]
        assert len(m["control_ratios"]) == 2 and all(r > 0 for r in m["control_ratios"]), m["kind"]
        assert len(m["rates"]["control"]) == 2 and 0 < m["below_control_p"] <= 1, m["kind"]
    report = (tmp_path / "tf2-strategy-latest.md").read_text()
    assert "| tf_keras_subclassed | device 5 ms |" in report and "| control: model.fit again / model.fit |" in report


def test_routes_smoke_trains_both_routes_as_model_fit(tmp_path):
    #   python -m benchmarks.tf2_routes --smoke --kinds keras3_functional: layer and step route beside model.fit
    #   (the run fails, exit 1, when a route's losses or weights differ from model.fit's)
    run_benchmark("tf2_routes", tmp_path, "--smoke", "--kinds", "keras3_functional",
                  quiet_seconds=SMOKE_SECONDS["tf2_routes --kinds keras3_functional"])
    result = json.loads((tmp_path / "tf2-routes-latest.json").read_text())
    assert [(m["kind"], m["device_ms"]) for m in result["measured"]] == [("keras3_functional", 0.0),
                                                                         ("keras3_functional", 5.0)]
    for m in result["measured"]:
        assert m["losses_identical"] == m["weights_identical"] == {"layer_route": True, "step_route": True}
        assert len(m["ratios"]["layer_over_step"]) == 2 and all(r > 0 for r in m["ratios"]["layer_over_step"])
    assert result["command"].endswith("--smoke --kinds keras3_functional")


def test_trial_twin_smoke_times_the_four_programs(tmp_path):
    #   python -m benchmarks.tf2_trial_twin --smoke: the user's step, the trial's twin (two ways) and the split
    run_benchmark("tf2_trial_twin", tmp_path, "--smoke", quiet_seconds=SMOKE_SECONDS["tf2_trial_twin"])
    result = json.loads((tmp_path / "tf2-trial-twin-latest.json").read_text())
    assert sorted(result["steps_per_second"]) == ["split", "twin", "twin_called", "user_step"]
    assert all(len(v["values"]) == 2 and min(v["values"]) > 0 for v in result["steps_per_second"].values())
    assert sorted(result["ratios"]) == ["split/twin", "split/user_step", "twin/user_step", "twin_called/user_step"]
