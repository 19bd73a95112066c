"""The benchmarks run end to end in their smallest mode, so they keep working.

    python -m benchmarks.e2e --smoke        # a tiny DLRM-like model, every configuration, a 2-point grid
    python -m benchmarks.scaling --smoke    # one 5,000-node training graph, each operation in its own process
    python -m benchmarks.ports --smoke      # one DeepRec script, flag off and on, a few steps

Each runs in a subprocess of its own (the benchmarks set process-wide TensorFlow state), one at a time
(tests/benchmark_runs.py). The numbers are not checked, only that every configuration and operation produced
one, and that the JSON, Markdown and PNG were written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.benchmark_runs import SMOKE_SECONDS, run_benchmark

pytestmark = pytest.mark.slow  # runs benchmarks or training jobs in subprocesses: started first (tests/conftest.py)


def _latest(out_dir: Path, stem: str) -> dict:
    return json.loads((out_dir / f"{stem}-latest.json").read_text())


def test_e2e_smoke_measures_every_configuration(tmp_path):
    out = tmp_path
    stdout = run_benchmark("e2e", out, "--smoke", quiet_seconds=SMOKE_SECONDS["e2e"]).stdout
    result = _latest(out, "e2e")
    (workload,) = result["workloads"]
    assert not workload["errors"]
    for name in ("no_stage", "staged", "staged_fold", "tfdata_prefetch", "tfdata_map", "smart", "smart_lanes",
                 "smart_prefetch", "auto_stage", "auto_stage_lanes"):
        row = workload["rows"][name]
        assert row["default"]["median"] > 0, name
        if name in ("staged", "smart_lanes", "auto_stage_lanes"):  # on lanes: a hand-tuned grid point as well
            assert row["best"]["median"] > 0 and row["best_label"] != "AUTOTUNE (defaults)", name
    for name in ("staged", "smart_lanes", "auto_stage_lanes"):  # AUTOTUNE settled before the blocks
        assert workload["settle"][name]["settled"], workload["settle"][name]
    for name in ("staged_fold", "smart", "smart_prefetch", "auto_stage"):  # folded: nothing of ours to settle
        assert workload["settle"][name] == {"steps": 0, "seconds": 0.0, "settled": True, "decisions": [],
                                            "folded": True}, name
    # folded and lanes side by side, each with its fraction of min(bare step, CPU bound) of the same repeat
    assert [(r["folded"], r["lanes"]) for r in workload["fold_lanes"]] == [
        ("staged_fold", "staged"), ("smart", "smart_lanes"), ("auto_stage", "auto_stage_lanes")]
    for row in workload["fold_lanes"]:
        assert row["folded_of_limit"]["median"] > 0 and row["lanes_of_limit"]["median"] > 0, row
    assert workload["smart_stage"]["moved"] > 0
    assert workload["sides_ms"]["input"]["t_train"]["median"] > 0
    assert workload["sides_ms"]["smart"]["t_train"]["median"] > 0
    assert "| dlrm/io | SmartStage | >= 0.9 of the limit |" in stdout
    assert "| dlrm/io | SmartStage auto-stage (no staged()) | never below no stage (>= 1.0x) |" in stdout
    assert "| dlrm/io | SmartStage | " in stdout and "| dlrm/io | SmartStage | SmartStage on lanes |" not in stdout
    assert "| dlrm/io | staged(), flag off, folded |" in stdout  # the folded / lanes table
    assert "| dlrm/io | SmartStage |" in (out / "e2e-summary-latest.md").read_text()
    if _has_matplotlib():
        assert (out / "e2e-latest.png").stat().st_size > 0


def test_scaling_smoke_measures_every_operation(tmp_path):
    out = tmp_path
    stdout = run_benchmark("scaling", out, "--smoke", quiet_seconds=SMOKE_SECONDS["scaling"]).stdout
    result = _latest(out, "scaling")
    assert not result["errors"]
    (row,) = result["summary"]["rows"].values()
    for op in ("parse", "import", "optimize"):
        assert row[op]["cpu_seconds"]["median"] > 0, op
    assert row["optimize"]["moved"] > 0
    assert 4_000 < row["optimize"]["nodes"] < 6_000
    assert "optimize / import" in stdout
    assert "optimize / import" in (out / "scaling-latest.md").read_text()
    if _has_matplotlib():
        assert (out / "scaling-latest.png").stat().st_size > 0


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_ports_smoke_times_every_run(tmp_path):
    out = tmp_path
    run_benchmark("ports", out, "--smoke", quiet_seconds=SMOKE_SECONDS["ports"])
    result = _latest(out, "ports")
    assert not result["errors"]
    for run in ("off", "on 4/40", "on defaults"):
        for window in ("early", "steady", "first 8", "startup"):  # smoke: the first 8 steps, not 100 and 1,000
            (value,) = result[window][f"dlrm {run}"]
            assert value > 0, (run, window)
    text = (out / "ports-latest.md").read_text()
    assert text.count("| dlrm |") == 4 and "**Steady**" in text and "**First 8 steps**" in text
    assert "**Startup**" in text


def test_the_limit_of_one_core_per_side_overlaps_waits_not_cpu_time():
    from types import SimpleNamespace

    from benchmarks.e2e import WorkloadRun
    from benchmarks.sides import Sides

    # The input side computes 11 ms a batch (no waits), the training side 6 ms: on a core of its own the
    # input side cannot go past 1/11 ms whatever the lanes; with the machine's cores 4 lanes divide it.
    sides = {"smart": Sides(t_in=0.011, t_train=0.006, cpu_in=0.0115, cpu_train=0.0065)}
    run = lambda one_core: SimpleNamespace(sides=[sides], cores=[2.0],
                                           workload=SimpleNamespace(one_core_per_side=one_core))
    assert WorkloadRun.bounds(run(True), 0, 4)["limit"] == pytest.approx(1 / 0.011)
    cores = os.cpu_count() or 1
    assert WorkloadRun.bounds(run(False), 0, 4)["limit"] == pytest.approx(min(1 / 0.006, cores / 0.018))
    # Waits do overlap on one core: an input side that mostly waits (1 ms of CPU in 8 ms) gets 4 lanes' worth.
    waiting = {"smart": Sides(t_in=0.008, t_train=0.003, cpu_in=0.001, cpu_train=0.0035)}
    one = SimpleNamespace(sides=[waiting], cores=[2.0], workload=SimpleNamespace(one_core_per_side=True))
    assert WorkloadRun.bounds(one, 0, 4)["limit"] == pytest.approx(1 / 0.003)


def test_the_held_out_best_grid_point_is_picked_on_the_other_repeats():
    from benchmarks.e2e_tables import held_out_ratio

    default = [80.0, 80.0, 80.0]
    # "a" is best in repeats 0 and 1, "b" in repeat 2 only: left out, repeat 2 is compared with "a".
    points = {"a": [90.0, 88.0, 70.0], "b": [85.0, 84.0, 100.0]}
    held = held_out_ratio(default, points)
    assert held.n == 3
    # repeat 0: picked on repeats 1, 2 -> medians a 79, b 92 -> b (85); repeat 1: a 80, b 92.5 -> b (84);
    # repeat 2: a 89, b 84.5 -> a (70)
    assert held.median == pytest.approx(80 / 84) and held.high == pytest.approx(80 / 70)
    assert held.low == pytest.approx(80 / 85)


def test_tf2_smoke_measures_every_program(tmp_path):
    # Its own process (eager mode, TensorFlow 2's default, which the suite's conftest turns off here).
    proc = run_benchmark("tf2", tmp_path, "--smoke", "--repeats", "3", quiet_seconds=SMOKE_SECONDS["tf2"])
    result = _latest(tmp_path, "tf2")
    assert result["command"] == "python -m benchmarks.tf2 --smoke --repeats 3"  # the report re-runs as it ran
    assert [s["device_ms"] for s in result["settings"]] == [0.0, 5.0]
    for setting in result["settings"]:
        for program in ("in_model", "handwritten", "smartstage", "split_untimed"):
            assert setting["steps_per_second"][program]["spread"]["median"] > 0, program
            assert len(setting["steps_per_second"][program]["values"]) == 3, program
            assert setting["losses_identical"][program], program
        assert "moved" in setting["split_notes"] and setting["kept"].startswith(("split (", "unsplit ("))
    assert "| CPU |" in proc.stdout and "| accelerator (emulated, 5 ms/step) |" in proc.stdout
    assert ">= 0.95x hand-written" in (tmp_path / "tf2-latest.md").read_text()


def test_read_cost_times_both_reads():
    from benchmarks import read_cost

    times = read_cost.measure(tensors=3, batch=16, dtype="string", repeats=2)
    assert set(times) == {"iterator read", "queue dequeue"}
    assert all(len(values) == 2 and all(v > 0 for v in values) for values in times.values())


def test_the_cluster_model_predicts_from_the_measured_cpu_of_each_side():
    from benchmarks.scale_out_model import ClusterModel

    # the trainer: 28 ms of CPU a step with everything local, 11 ms with input tasks; a task 12.5 ms of CPU a
    # batch; a lane 25 ms a batch, wall (one batch at a time: head, round trip, body)
    model = ClusterModel(c_in=0.010, local_cpu=0.028, trainer_cpu=0.011, task_cpu=0.0125, lane_seconds=0.025,
                         boundary_bytes=1000)
    assert model.local_rate(1) == pytest.approx(1 / 0.028)
    assert model.tasks_rate(1, 1, 1) == pytest.approx(1 / 0.025)       # one lane binds
    assert model.tasks_rate(1, 2, 1) == pytest.approx(2 / 0.025)       # two lanes bind
    assert model.tasks_rate(8, 4, 0.25) == pytest.approx(1 / 0.0125)   # four tasks sharing one core: it binds
    assert model.tasks_rate(1, 4, 1) == pytest.approx(1 / 0.011)       # four: the trainer's core binds
    assert model.tasks_rate(8, 4, 4, lanes_per_task=4) == pytest.approx(16 / 0.025)
    assert model.tasks_needed(1, 1) == 3 and model.tasks_needed(8, 4, 4) == 5  # 90.9 over 40; 727 over 160
    slow_link = ClusterModel(0.010, 0.028, 0.011, 0.0125, 0.025, boundary_bytes=10**6, bandwidth=10**8)
    assert slow_link.tasks_rate(8, 16, 4, 4) == pytest.approx(100.0)  # 100 MB/s over 1 MB batches
    # a term measured as 0 (a run shorter than the CPU clock's tick) bounds nothing instead of dividing by zero
    free_tasks = ClusterModel(0.010, 0.028, 0.011, task_cpu=0.0, lane_seconds=0.025, boundary_bytes=1000)
    assert free_tasks.tasks_rate(1, 1, 1) == pytest.approx(1 / 0.025) and free_tasks.tasks_needed(1, 1) == 3
    assert ClusterModel(0.0, 0.0, 0.0, 0.0, 0.025, boundary_bytes=0).tasks_needed(1, 1) == 1  # nothing binds the trainer


def test_the_accelerator_targets_compare_with_the_bare_step_and_the_best_alternative():
    from types import SimpleNamespace

    from benchmarks.accelerator_tables import accelerator_targets
    from benchmarks.runners import DEFAULT_SETTING

    def samples(*rates):
        return [SimpleNamespace(steps_per_sec=r) for r in rates]

    rates = {"no_stage": (50, 52), "staged": (55, 55), "tfdata_prefetch": (60, 58), "tfdata_map": (70, 74),
             "smart": (95, 97), "smart_prefetch": (90, 90), "auto_stage": (80, 82)}
    summary = {"samples": {(name, DEFAULT_SETTING): samples(*r) for name, r in rates.items()},
               "bounds": [{"bare": 100.0, "cpu_bound": 150.0}, {"bare": 100.0, "cpu_bound": 150.0}]}
    a = accelerator_targets(summary)["accelerator"]
    assert a["best_alternative"] == "tfdata_map" and a["room"].median == pytest.approx((100 / 70 + 100 / 74) / 2)
    assert a["required"] == 1.1  # the bare step leaves >= 20% over the best alternative
    smart, auto = a["targets"]["smart"], a["targets"]["auto_stage"]
    assert smart["of_bare"].median == pytest.approx(0.96) and all(smart["met"].values())
    assert auto["vs_best_alternative"].median == pytest.approx((80 / 70 + 82 / 74) / 2)
    assert auto["met"] == {">= 0.95 of the bare step": False, ">= 1.1x best alternative": True,
                           "never below no stage (>= 1.0x)": True}


def test_accelerator_smoke_measures_every_configuration_the_bare_step_and_the_bound(tmp_path):
    run_benchmark("e2e", tmp_path, "--accelerator", "--smoke",
                  quiet_seconds=SMOKE_SECONDS["e2e --accelerator"])
    (workload,) = _latest(tmp_path, "accelerator")["workloads"]
    assert workload["workload"]["device_ms"] == 2.0 and not workload["errors"]
    rates = workload["accelerator"]["rates"]
    for name in ("no_stage", "staged", "staged_fold", "tfdata_prefetch", "tfdata_map", "smart", "smart_lanes",
                 "auto_stage", "auto_stage_lanes"):
        assert rates[name]["median"] > 0, name
    assert len(workload["fold_lanes"]) == 3
    assert workload["accelerator"]["bare"]["median"] > 0 and workload["accelerator"]["cpu_bound"]["median"] > 0
    report = (tmp_path / "accelerator-latest.md").read_text()
    assert "| dlrm/device 2 ms | SmartStage |" in report
    assert "| dlrm/device 2 ms | SmartStage | " in report and "| SmartStage on lanes |" in report
    # the family does not run SmartStage + tf.data prefetch: no row of dashes, no "not settled" for it
    assert "| SmartStage + tf.data prefetch | - |" not in report and "not settled (- steps)" not in report


@pytest.mark.parametrize("token, threads, own_pool, inter_op", [
    ("1s", 1, False, 0), ("2o", 2, True, 0), ("1s4", 1, False, 4), ("3o2", 3, True, 2)])
def test_accelerator_probe_points_name_lanes_pool_and_the_steps_pool(token, threads, own_pool, inter_op):
    import smartstage as ss
    from benchmarks.accelerator_probe import point_setting
    from benchmarks.runners import DEFAULT_SETTING

    setting = point_setting(token)
    assert (setting.threads, setting.capacity, setting.own_pool, setting.inter_op) == (
        threads, ss.AUTOTUNE, own_pool, inter_op)
    assert point_setting("auto") == DEFAULT_SETTING


def test_accelerator_probe_refuses_a_point_it_cannot_read():
    from benchmarks.accelerator_probe import point_setting

    with pytest.raises(ValueError, match="'2x'"):
        point_setting("2x")


def test_accelerator_probe_finds_the_take_the_train_op_reads():
    #   range -> put ~~ take -> mul -> loss -> train (the take the probe runs alone)
    import tensorflow as tf

    import smartstage as ss
    from benchmarks.accelerator_probe import take_op

    graph = tf.Graph()
    with graph.as_default():
        x = tf.cast(tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10)).get_next(), tf.float32)
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.square(ss.staged(x) * w)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    take = take_op(graph, train)
    assert take.type == "QueueDequeueV2" and take.name.endswith("take")
    with pytest.raises(LookupError, match="no stage take"):
        take_op(graph, x.op)


def test_accelerator_probe_smoke_measures_every_point_and_the_bare_step(tmp_path):
    run_benchmark("accelerator_probe", tmp_path, "--smoke", "--points", "auto,1s,2o",
                  quiet_seconds=SMOKE_SECONDS["accelerator_probe"])
    result = _latest(tmp_path, "accelerator-probe")
    for point in ("auto", "1s", "2o"):
        (sample,) = result["samples"][point]
        assert sample["steps_per_sec"] > 0 and sample["alone_per_sec"] > 0, point
    assert result["samples"]["2o"][0]["lanes"] == [2] and result["samples"]["2o"][0]["own_pool"] == [True]
    (bare,) = result["samples"]["sides"]
    assert bare["device_ms"] >= 5.0  # the device op waits its 5 ms whatever the host does
    assert "| 1s | 1 thread(s), capacity AUTOTUNE, shared pool |" in (tmp_path / "accelerator-probe-latest.md").read_text()
