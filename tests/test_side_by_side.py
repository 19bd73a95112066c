"""benchmarks.side_by_side: two runs' figures beside each other, each run's own, nothing re-measured."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest

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
        "| dlrm_step | device 5 ms | smartstage/in_model | 1.00 (0.90-1.10) | 1.20 (1.10-1.30) | no (p 1.00) |",
        "| tf_keras_functional | CPU | smartstage/in_model | 1.00 (0.90-1.10) | 1.20 (1.10-1.30) | no (p 1.00) |",
    ]
    slower = side_by_side.tf2_table(run("a", 1.0), run("b", 0.7)).splitlines()
    assert slower[0].endswith("| newer slower? |")
    # 3 rounds each, every newer one below every older one: 2 of the 20 relabelings put the newer median as far
    # below, p 0.10, so three rounds a side cannot read "slower"
    assert slower[2].endswith("| 1.00 (0.90-1.10) | 0.70 (0.60-0.80) | no (p 0.10) |")


def test_tf2_strategy_runs_side_by_side_with_a_kind_only_one_run_has():
    def run(date, kinds):
        return {"benchmark": "tf2_strategy", "machine": {"date": date, "load_average_at_start": [0.5]},
                "measured": [{"kind": k, "device_ms": 0.0, "ratios": [0.9, 1.0, 0.95]} for k in kinds]}

    assert side_by_side.tf2_strategy_table(run("a", ["f"]), run("b", ["f", "s"])).splitlines()[2:] == [
        "| f | CPU | ss.tf2.fit / model.fit | 0.95 (0.90-1.00) | 0.95 (0.90-1.00) | no (p 0.70) |",
        "| s | CPU | ss.tf2.fit / model.fit | - | 0.95 (0.90-1.00) | - |",
    ]


def _brute_force_p(old, new):
    """The permutation test by enumeration: every way to label len(new) of the pooled rounds "newer"."""
    pool, observed = old + new, statistics.median(new) - statistics.median(old)
    labelings = list(itertools.combinations(range(len(pool)), len(new)))
    below = sum(statistics.median([pool[i] for i in picked])
                - statistics.median([pool[i] for i in range(len(pool)) if i not in picked]) <= observed + 1e-12
                for picked in labelings)
    return below / len(labelings)


@pytest.mark.parametrize("old, new, slower", [
    ([1.0, 1.01, 1.02, 1.03, 1.04], [0.90, 0.91, 0.92, 0.93, 0.94], True),   # every newer round below: 6/252
    ([1.02, 0.96, 1.12, 0.98, 1.05], [0.98, 0.93, 1.14, 1.0, 0.95, 1.01, 0.97], False),  # within the spread
    ([0.94, 0.96, 0.98], [0.92, 0.93, 0.97, 0.95], False),
    ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], False),  # identical runs: every relabeling ties
])
def test_slower_p_is_the_permutation_tests_p(old, new, slower):
    p = side_by_side.slower_p(old, new)
    assert p == pytest.approx(_brute_force_p(old, new))
    assert (p < side_by_side.SLOWER_BELOW) == slower
