"""`smartstage demo --train`: flag off and on trained side by side, every common step's loss compared."""

from __future__ import annotations

import functools

import pytest

from smartstage.cli import demo_train
from smartstage.cli.demo_train import DemoComparison, TrainRun, train_demo, train_text
from smartstage.cli.main import main

SMALL = dict(rows=600, batch_size=32, small=True, devices=(("CPU only", 0.0), ("emulated accelerator", 2.0)))


def test_the_demo_trains_both_devices_flag_off_and_on_with_identical_losses(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_train, "WARMUP_SECONDS", 0.3)
    monkeypatch.setattr(demo_train, "SETTLE_SECONDS", 2.0)
    comparisons = train_demo(tmp_path, 0.3, **SMALL)
    assert [c.device for c in comparisons] == ["CPU only", "emulated accelerator"]
    for c in comparisons:
        assert (c.off.flag, c.on.flag) == (False, True) and c.off.device_ms == c.on.device_ms
        assert c.compared >= 2 and c.identical, c.device  # the same batches in the same order, the same model
        assert c.off.steps_per_sec > 0 and c.on.steps_per_sec > 0
        assert c.on.verdict.startswith("stage '") or c.on.verdict == "no report yet"
    text = train_text(comparisons, 0.3)
    assert "losses identical" in text and text.count("yes (first ") == 2
    assert "pipeline, emulated accelerator, flag on:" in text


def test_a_loss_that_differs_reads_no():
    off = TrainRun(False, 0.0, 10.0, (0.5, 0.4, 0.3), "v")
    on = TrainRun(True, 0.0, 12.0, (0.5, 0.41), "v")
    c = DemoComparison("CPU only", off, on)
    assert c.compared == 2 and not c.identical and c.speedup == pytest.approx(1.2)
    assert "NO (first 2 steps compared)" in train_text([c], 1.0)
    assert not DemoComparison("CPU only", off, TrainRun(True, 0.0, 1.0, (), "v")).identical  # nothing compared


def test_the_command_prints_the_training_table_after_the_diff(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo_train, "WARMUP_SECONDS", 0.2)
    monkeypatch.setattr(demo_train, "SETTLE_SECONDS", 1.0)
    monkeypatch.setattr(demo_train, "train_demo", functools.partial(train_demo, **SMALL))
    assert main(["demo", "--out", str(tmp_path), "--train", "0.2"]) == 0
    out = capsys.readouterr().out
    assert out.index("moved") < out.index("losses identical")  # the plain demo's output first, unchanged
    assert "flag off" in out and "flag on" in out and out.count("yes (first ") == 2


def _report(**fields):
    from smartstage.runtime.hooks.pipeline_hook import PipelineReport

    base = dict(stage="stage", step=50, steps=50, steps_per_second=40.0, step_ms=25.0, consumer_wait_ms=3.0,
                occupancy=None, last_occupancy=None, capacity=-1, producer_ms=0.0, producer_wait_ms=0.0,
                batches_per_second=40.0, num_threads=-1, ordered=True, own_pool=False, autotuned=(),
                max_buffered_bytes=0, verdict="balanced", line="", folded=True)
    return PipelineReport(**{**base, **fields})


def test_the_verdict_of_a_folded_stage_says_autotuned_and_not_measured():
    # The demo prints this line for the flag-on run: a folded stage has no size op and an AUTOTUNE prefetch.
    from smartstage.runtime.hooks.pipeline_hook import _verdict_line

    line = _verdict_line(_report())
    assert "the buffer's fill is not measured (capacity autotuned)" in line, line
    assert "?" not in line and "-1" not in line, line
    line = _verdict_line(_report(folded=False, occupancy=2.5, capacity=8, num_threads=2))
    assert "the buffer holds 2.5 of 8;" in line, line
    line = _verdict_line(_report(folded=False, verdict="training-bound", occupancy=7.5, capacity=-1, num_threads=2))
    assert "the buffer stays full (7.5 of autotuned)" in line, line
