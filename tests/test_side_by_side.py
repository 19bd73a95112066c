"""benchmarks.side_by_side: two runs' figures beside each other, each run's own, nothing re-measured."""

from __future__ import annotations

import json

from benchmarks import side_by_side


def _spread(median, low, high):
    return {"median": median, "low": low, "high": high, "n": 5}


def _e2e_run(date, smart):
    workload = {"model": "dlrm", "variant": "device", "device_ms": 2.0, "read_latency_ms": 0.0}
    return {"benchmark": "e2e", "machine": {"date": date, "load_average_at_start": [0.9, 1.0, 1.0]},
            "workloads": [{"workload": workload, "targets": {"smart": {"of_limit": smart},
                                                             "smart_lanes": {"of_limit": {"n": 0}}}}]}


def test_e2e_runs_side_by_side_with_whether_the_newer_meets_the_target():
    old = _e2e_run("2026-11-27", _spread(0.92, 0.80, 0.93))
    new = _e2e_run("2026-11-28", _spread(0.796, 0.64, 0.97))
    assert side_by_side.e2e_table(old, new).splitlines() == [
        "| workload | configuration | of the limit, 2026-11-27, load 0.9 at start | of the limit, 2026-11-28, load 0.9 "
        "at start | met (>= 0.9) |",
        "|---|---|---|---|---|",
        "| dlrm/device 2 ms | SmartStage | 0.92 (0.80-0.93) | 0.80 (0.64-0.97) | no (0.796) |",
    ]


def test_scaling_runs_side_by_side_as_ratios_to_import():
    def run(date, optimize, imported):
        row = {"optimize": {"cpu_seconds": {"median": optimize}}, "import": {"cpu_seconds": {"median": imported}}}
        return {"benchmark": "scaling", "machine": {"date": date, "load_average_at_start": [1.0]},
                "summary": {"rows": {"100000": row}}}

    table = side_by_side.scaling_table(run("a", 2.0, 4.0), run("b", 1.0, 5.0)).splitlines()
    assert table[2] == "| 100,000 | 2.00 | 0.50x | 1.00 | 0.20x |"


def test_two_benchmarks_are_refused(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"benchmark": "e2e"}))
    new.write_text(json.dumps({"benchmark": "scaling"}))
    assert side_by_side.main([str(old), str(new)]) == 2
    assert "give two runs of one benchmark" in capsys.readouterr().err


def test_tf2_runs_side_by_side_per_kind_setting_and_ratio():
    def run(date, ratio):
        setting = {"device_ms": 5.0, "ratios": {"smartstage/in_model": {"values": [ratio, ratio - 0.1, ratio + 0.1]}}}
        return {"benchmark": "tf2", "machine": {"date": date, "load_average_at_start": [0.5]},
                "settings": [setting], "kinds": {"tf_keras_functional": [dict(setting, device_ms=0.0)]}}

    assert side_by_side.tf2_table(run("a", 1.0), run("b", 1.2)).splitlines()[2:] == [
        "| dlrm_step | device 5 ms | smartstage/in_model | 1.00 (0.90-1.10) | 1.20 (1.10-1.30) |",
        "| tf_keras_functional | CPU | smartstage/in_model | 1.00 (0.90-1.10) | 1.20 (1.10-1.30) |",
    ]


def test_tf2_strategy_runs_side_by_side_with_a_kind_only_one_run_has():
    def run(date, kinds):
        return {"benchmark": "tf2_strategy", "machine": {"date": date, "load_average_at_start": [0.5]},
                "measured": [{"kind": k, "device_ms": 0.0, "ratios": [0.9, 1.0, 0.95]} for k in kinds]}

    assert side_by_side.tf2_strategy_table(run("a", ["f"]), run("b", ["f", "s"])).splitlines()[2:] == [
        "| f | CPU | ss.tf2.fit / model.fit | 0.95 (0.90-1.00) | 0.95 (0.90-1.00) |",
        "| s | CPU | ss.tf2.fit / model.fit | - | 0.95 (0.90-1.00) |",
    ]
