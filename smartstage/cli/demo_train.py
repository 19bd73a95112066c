"""`smartstage demo --train`: what the flag buys on the built-in DLRM-like example, and that it changes no value.

    before:  smartstage demo            # what moves behind the stage, what stays, why
    after:   smartstage demo --train    # + steps/s flag off and on, on the CPU and on an emulated accelerator,
                                        #   "losses identical: yes", and the pipeline's verdict

Each run builds the example (batch 512, benchmark-size preprocessing: crosses, bucketized columns, vocabulary
lookups) behind `ss.staged()` and trains it through `ss.MonitoredTrainingSession` with the prefetch and
pipeline hooks: flag off (the same staged graph, not rewritten) and flag on (do_smart_stage). Both stages
run at staged()'s defaults (AUTOTUNE), so each run trains until its tuner settled (at most SETTLE_SECONDS:
while it tries lanes and pools, each try builds executors, which stalls the session), then steps/s is
timed over a few seconds: the rate a training job runs at. The first steps are benchmarks.ports' subject. The emulated accelerator (smartstage/examples/device.py)
keeps the same input pipeline and turns the model's compute into a host-idle wait of a few ms a step: the case SmartStage
is built for, where the host CPU would otherwise sit idle while the device works. Losses are compared
step by step over the steps both runs made.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEMO_ROWS = 10_000
DEMO_BATCH = 512
WARMUP_SECONDS = 1.5
SETTLE_SECONDS = 15.0  # the most a run trains before timing, waiting for AUTOTUNE to settle
ACCELERATOR_MS = 5.0
DEVICES = (("CPU only", 0.0), (f"emulated accelerator ({ACCELERATOR_MS:g} ms a step)", ACCELERATOR_MS))


@dataclass(frozen=True)
class TrainRun:
    """One timed training run of the example: its rate, every loss, and the pipeline's last verdict."""

    flag: bool
    device_ms: float
    steps_per_sec: float
    losses: tuple[float, ...]
    verdict: str
    warmup_steps: int = 0  # steps before the timed ones (the warm-up, AUTOTUNE settling)
    settled: bool = True


@dataclass(frozen=True)
class DemoComparison:
    """Flag off against flag on on one device: the speed-up and whether every common step's loss is equal."""

    device: str
    off: TrainRun
    on: TrainRun

    @property
    def speedup(self) -> float:
        return self.on.steps_per_sec / self.off.steps_per_sec if self.off.steps_per_sec else float("nan")

    @property
    def compared(self) -> int:
        return min(len(self.off.losses), len(self.on.losses))

    @property
    def identical(self) -> bool:
        n = self.compared
        return n > 0 and np.array_equal(np.array(self.off.losses[:n]), np.array(self.on.losses[:n]))


def train_once(files, device_ms: float, flag: bool, seconds: float, *, batch_size: int = DEMO_BATCH,
               small: bool = False, warmup_seconds: float = WARMUP_SECONDS) -> TrainRun:
    """Trains the example with the flag off or on for `seconds` after a warm-up; what it measured.

        train_once(files, 0.0, flag=True, seconds=3.0)   # before: a staged example graph
                                                         # after:  TrainRun(steps_per_sec=..., losses=(...), verdict=...)
    """
    import tensorflow as tf

    import smartstage as ss
    from smartstage.examples import DLRMOptions, InputOptions, build_dlrm
    from smartstage.examples.device import build_device_model
    from smartstage.runtime.door import latest_prefetch_threads

    def settled() -> bool:
        threads = latest_prefetch_threads(graph)
        return threads is not None and all(d.settled for d in threads.decisions())

    graph = tf.Graph()
    with graph.as_default():
        options = DLRMOptions() if small else DLRMOptions.benchmark()
        builder = build_dlrm if not device_ms else functools.partial(build_device_model, device_ms=device_ms)
        model = builder(files.data_path, files.vocabulary_paths, stage_fn=ss.staged, options=options,
                        input_options=InputOptions(batch_size=batch_size))
        config = ss.enable_smart_stage(tf.compat.v1.ConfigProto()) if flag else tf.compat.v1.ConfigProto()
        pipeline = ss.make_pipeline_hook(every_n_steps=50, log=False)
        losses: list[float] = []
        with ss.MonitoredTrainingSession(config=config, hooks=[ss.make_prefetch_hook(), pipeline],
                                         save_checkpoint_secs=None, save_summaries_steps=None,
                                         save_summaries_secs=None, log_step_count_steps=None,
                                         save_graph_def=False) as sess:
            step = lambda: losses.append(float(sess.run([model.loss, model.train_op])[0]))  # noqa: E731
            begun = time.perf_counter()
            while time.perf_counter() - begun < warmup_seconds or len(losses) < 2 or (
                    not settled() and time.perf_counter() - begun < SETTLE_SECONDS):
                step()
            done, calm, begun = len(losses), settled(), time.perf_counter()
            while time.perf_counter() - begun < seconds:
                step()
            rate = (len(losses) - done) / (time.perf_counter() - begun)
    report = pipeline.last_report
    return TrainRun(flag, device_ms, rate, tuple(losses), report.line if report is not None else "no report yet",
                    done, calm)


def train_demo(workdir: Path, seconds: float, *, rows: int = DEMO_ROWS, batch_size: int = DEMO_BATCH,
               small: bool = False, devices=DEVICES) -> list[DemoComparison]:
    """Flag off and on, per device, on a synthetic Criteo-like CSV written in `workdir`.

        train_demo(Path(tmp), 3.0)   # before: nothing measured
                                     # after:  [DemoComparison("CPU only", off, on), DemoComparison("emulated ...", ...)]
    """
    from smartstage.examples import prepare_criteo

    files = prepare_criteo(Path(workdir) / "train-data", rows, 0)
    out = []
    for device, ms in devices:
        off = train_once(files, ms, False, seconds, batch_size=batch_size, small=small)
        on = train_once(files, ms, True, seconds, batch_size=batch_size, small=small)
        out.append(DemoComparison(device, off, on))
    return out


def train_text(comparisons: list[DemoComparison], seconds: float) -> str:
    """The demo's training table and verdicts, as printed."""
    width = max(len(c.device) for c in comparisons)
    lines = [f"Training the DLRM-like example (batch {DEMO_BATCH}) through ss.MonitoredTrainingSession; each run "
             f"timed over {seconds:g} s once AUTOTUNE settled (at most {SETTLE_SECONDS:g} s of warm-up):", "",
             f"  {'':{width}}  {'flag off':>13}  {'flag on':>13}  {'speed-up':>8}  losses identical"]
    for c in comparisons:
        same = f"yes (first {c.compared} steps)" if c.identical else f"NO (first {c.compared} steps compared)"
        lines.append(f"  {c.device:{width}}  {c.off.steps_per_sec:7.1f} step/s  {c.on.steps_per_sec:7.1f} step/s  "
                     f"{c.speedup:7.2f}x  {same}")
    unsettled = [f"{c.device}, flag {'on' if r.flag else 'off'}" for c in comparisons for r in (c.off, c.on)
                 if not r.settled]
    if unsettled:
        lines.append(f"  (AUTOTUNE still trying settings when timed: {'; '.join(unsettled)})")
    lines.append("")
    for c in comparisons:
        lines.append(f"pipeline, {c.device}, flag off: {c.off.verdict}")
        lines.append(f"pipeline, {c.device}, flag on:  {c.on.verdict}")
    return "\n".join(lines) + "\n"
