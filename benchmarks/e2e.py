"""End-to-end benchmark: global steps/sec of DLRM-like and Wide&Deep-like training, every configuration.

    python -m benchmarks.e2e --publish  # 2 models x (cpu, io, 1 core per side), grid, 5 repeats
    python -m benchmarks.e2e --quick    # DLRM-like, CPU-bound, defaults only, 5 repeats (~2 min)
    python -m benchmarks.e2e --smoke    # tiny models on 2,000 rows: checks that everything runs (the test)
    python -m benchmarks.e2e --accelerator --publish   # the emulated accelerator: device 2/5/10/20 ms, 2 models
    python -m benchmarks.e2e --accelerator --gpu --publish   # the same on a real GPU (do_smart_stage_gpu)

Folded stages run beside the same stages on lanes in every run (benchmarks/runners.py FOLD_PAIRS: staged()
flag off, SmartStage, auto-stage; tf_data_stage "fold" against "lanes"), interleaved in the same repeats; the
report's "Folded into the dataset, and on lanes" table gives each its steps/s and its fraction of the limit
min(bare step, CPU bound), both measured in the same repeat. --publish also writes the dated report
docs/perf/<e2e|accelerator>-<YYYY-MM-DD>.md.

The accelerator family runs every configuration at its defaults on a model whose compute is a
host-idle wait of T ms a step (benchmarks/accelerator.py), beside the bare step (the step fed one cached,
preprocessed batch) and the CPU bound, and writes benchmarks/out/accelerator-*.{json,md,png}
(benchmarks/accelerator_tables.py); --publish copies them to docs/perf/accelerator.*.

Data: 200,000 synthetic Criteo-like rows (seed 0), written once to benchmarks/out/data/. Each
workload builds one graph per configuration and stage capacity (benchmarks/runners.py), opens one
session per grid point (defaults = AUTOTUNE; hand grid = threads 1/2/4 x capacity 4/40 x shared or
own pool), trains every AUTOTUNE stage until its tuner settled (reported), then in every repeat times
one block of each in a new shuffled order. A block first drains what the idle session buffered and
counts only what the pipeline produced (OpenRun.sample). Ratios of the defaults (to their own best
grid point, the limit, the best alternative, no stage) are taken within each repeat
(benchmarks/e2e_tables.py), and the targets (docs/performance.md) are computed from them. Writes
benchmarks/out/e2e-*.{json,md,png} and e2e-summary-latest.md; --publish copies them to docs/perf/.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

import smartstage as ss
from benchmarks.accelerator_tables import accelerator_markdown, accelerator_targets
from benchmarks.plots import accelerator_figure
from benchmarks.e2e_tables import fold_lanes_rows, plot, report_text, summary_markdown, targets
from benchmarks.report import (
    DEFAULT_OUT,
    PUBLISH_DIR,
    REPO_ROOT,
    Spread,
    available_cores,
    load_average,
    machine_info,
    write_outputs,
)
from benchmarks.runners import (
    CONFIGS,
    CONFIGS_BY_NAME,
    DEFAULT_SETTING,
    ConfigRunner,
    Setting,
    Workload,
    grid_for,
    smart_split,
)
from benchmarks.sides import Sides, SidesRunner
from smartstage.examples import CATEGORICAL_COLUMNS, CriteoFiles, prepare_criteo

logger = logging.getLogger("benchmarks.e2e")

SPLITS = ("input", "smart")


def prepare_data(out_dir: Path, rows: int, seed: int) -> CriteoFiles:
    """The CSV and vocabularies, generated once per (rows, seed, generator source) and reused."""
    source = (REPO_ROOT / "smartstage" / "examples" / "data.py").read_bytes()
    stamp = hashlib.sha1(source).hexdigest()[:12]
    where = out_dir / "data" / f"criteo-{rows}-seed{seed}"
    stamp_file = where / "generator.sha1"
    vocab = {col: str(where / "vocab" / f"{col}.txt") for col in CATEGORICAL_COLUMNS}
    if stamp_file.exists() and stamp_file.read_text() == stamp and (where / "train.csv").exists():
        return CriteoFiles(str(where / "train.csv"), vocab, rows, seed)
    start = time.perf_counter()
    files = prepare_criteo(where, rows, seed)
    stamp_file.write_text(stamp)
    _progress(f"generated {rows} rows (seed {seed}) in {time.perf_counter() - start:.1f} s: {files.data_path}")
    return files


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class WorkloadRun:
    """Everything measured for one workload: its graphs, one open session per grid point, the blocks."""

    def __init__(self, workload: Workload, files: CriteoFiles, args: argparse.Namespace):
        self.workload = workload
        self.args = args
        self.errors: list[str] = []
        configs = [c for c in CONFIGS if c.name in args.configs.split(",")]
        self.points = [(c.name, s) for c in configs for s in (
            grid_for(c, args.threads, args.inter_ops, args.capacities, (True,) if workload.one_core_per_side
                     else (False, True)) if args.grid else [DEFAULT_SETTING])]
        # One graph per configuration and capacity (the capacity is built into the buffer queue).
        self.runners: dict[tuple[str, int], ConfigRunner] = {}
        for name, setting in self.points:
            key = self.key(name, setting)
            if key not in self.runners:
                self.runners[key] = ConfigRunner(CONFIGS_BY_NAME[name], workload, files, key[1])
        self.sides_runner = SidesRunner(self.runners["no_stage", ss.AUTOTUNE],
                                        smart_split(self.runners["smart", ss.AUTOTUNE]))
        self.errors += self.sides_runner.notes
        self.settle: dict[str, dict] = {}
        self.samples: dict[tuple[str, Setting], list] = {point: [] for point in self.points}
        self.sides: list[dict[str, Sides] | None] = []
        self.cores: list[float] = []  # available_cores() of each repeat, beside its sides

    @staticmethod
    def key(name: str, setting: Setting) -> tuple[str, int]:
        return name, setting.capacity if CONFIGS_BY_NAME[name].has_stage else ss.AUTOTUNE

    def _error(self, what: str, error: Exception) -> None:
        message = f"{self.workload.name} {what}: {type(error).__name__}: {error}"
        logger.exception("measurement failed: %s", message)
        self.errors.append(message)

    def run(self, rng: random.Random) -> None:
        """Opens every grid point's session, then times one block of each per repeat, in shuffled order."""
        opened = {}
        for config, setting in self.points:
            try:
                opened[(config, setting)] = self.runners[self.key(config, setting)].open(setting)
            except Exception as error:  # noqa: BLE001  one failing configuration must not end the run
                self._error(f"{config} [{setting.label}] (open)", error)
        # AUTOTUNE: train each default stage until its tuner settled, before any block is timed.
        for (config, setting), run in opened.items():
            if setting == DEFAULT_SETTING and CONFIGS_BY_NAME[config].has_stage:
                try:
                    self.settle[config] = run.settle(self.args.settle_steps or sys.maxsize, self.args.settle_seconds)
                except Exception as error:  # noqa: BLE001
                    self._error(f"{config} (settle)", error)
                    continue
                for reason in self.settle[config].get("not_folded", []):  # timed as lanes, under a folded label
                    self.errors.append(f"{self.workload.name} {config}: not folded, runs on lanes: {reason}")
                _progress(f"  {config}: autotune settled={self.settle[config]['settled']} after "
                          f"{self.settle[config]['steps']} steps ({self.settle[config]['seconds']} s): "
                          f"{self.settle[config]['decisions']}")
                if not self.settle[config]["settled"]:
                    bound = f"{self.args.settle_steps} steps / " if self.args.settle_steps else ""
                    self.errors.append(f"{self.workload.name} {config}: autotune did not settle within "
                                       f"{bound}{self.args.settle_seconds} s ({self.settle[config]['steps']} steps)")
        self.sides_runner.open()
        # A block's warm-up drains what the idle session buffered (OpenRun.sample).
        warmup = self.args.warmup
        try:
            for repeat in range(self.args.repeats):
                items: list[Any] = list(opened) + ["sides"]
                rng.shuffle(items)
                for item in items:
                    if item == "sides":
                        try:
                            self.cores.append(available_cores())
                            self.sides.append(self.sides_runner.sample(warmup, self.args.steps))
                        except Exception as error:  # noqa: BLE001
                            self._error("sides", error)
                            self.sides.append(None)
                        continue
                    name, setting = item
                    try:
                        sample = opened[item].sample(warmup, self.args.steps)
                    except Exception as error:  # noqa: BLE001
                        self._error(f"{name} [{setting.label}]", error)
                        sample = None
                    self.samples[item].append(sample)
                    if sample is not None and sample.global_steps != sample.drained + self.args.steps:
                        self.errors.append(f"{self.workload.name} {name}: global_step advanced {sample.global_steps}, "
                                           f"expected {sample.drained + self.args.steps}")
                    _progress(f"  repeat {repeat + 1} {name:16} {setting.label:48} "
                              f"{sample.steps_per_sec if sample else float('nan'):7.1f} steps/s "
                              f"cpu {sample.cpu_ms_per_step if sample else float('nan'):6.1f} ms/step")
        finally:
            for run in opened.values():
                run.close()
            self.sides_runner.close()

    # -- derived numbers ------------------------------------------------------------------------

    def bounds(self, repeat: int, k: int) -> dict[str, float]:
        """The bounds of one repeat for k producer threads.

        ideal: 1/max(T_in, T_train) of the input pipeline | model split. limit_<split>:
        min(1/max(T_in(k), T_train), cores/(cpu_in + cpu_train)) with the machine's cores (one core
        per side: 2), where T_in(k) = T_in/k: k lanes overlap a batch's work; one core per side:
        T_in(k) = max(T_in/k, min(T_in, cpu_in)), lanes on one core overlap its waits, not its CPU
        time (T_in/k alone made the bound one no setting could reach: Wide&Deep's cut 99 steps/s
        where its input side computes 11 ms a batch on its one core). limit: the higher over both
        splits; limit_available: the same with the cores measured free in that repeat (a shared machine).
        """
        if repeat >= len(self.sides) or self.sides[repeat] is None:
            return {}
        sides = self.sides[repeat]
        cores = 2 if self.workload.one_core_per_side else (os.cpu_count() or 1)
        free = min(cores, self.cores[repeat]) if repeat < len(self.cores) else cores
        out = {"available_cores": free}
        if "input" in sides:
            s = sides["input"]
            out["ideal"] = 1.0 / max(s.t_in, s.t_train)
        # The bare step: the training step fed one cached batch of the split that leaves it the least work
        # (the preprocessed features, or SmartStage's cut when stateless work follows the features, as the
        # id spaces the models combine): no input pipeline can beat it. The CPU bound: the same split's.
        if sides:
            bare = min(sides.values(), key=lambda s: s.t_train)
            out["bare"] = 1.0 / bare.t_train
            out["bare_split"] = next(name for name, s in sides.items() if s is bare)
            out["cpu_bound"] = max(cores / (s.cpu_in + s.cpu_train) for s in sides.values())
        limits, available = [], []
        one_core = self.workload.one_core_per_side
        for name, s in sides.items():
            t_in = max(s.t_in / k, min(s.t_in, s.cpu_in)) if one_core else s.t_in / k
            pipeline = 1.0 / max(t_in, s.t_train)
            out[f"limit_{name}"] = min(pipeline, cores / (s.cpu_in + s.cpu_train))
            limits.append(out[f"limit_{name}"])
            available.append(min(pipeline, free / (s.cpu_in + s.cpu_train)))
        if limits:
            out["limit"] = max(limits)
            out["limit_available"] = max(available)
        return out

    def summary(self) -> dict[str, Any]:
        """Everything the tables need; the ratios are taken within each repeat (benchmarks/e2e_tables.py)."""
        sides = {name: {field: Spread.of(getattr(s[name], field) * 1000 for s in self.sides if s and name in s)
                        for field in ("t_in", "t_train", "cpu_in", "cpu_train")} for name in SPLITS}
        k = max(self.args.threads)
        bounds = [self.bounds(r, k) for r in range(len(self.sides))]
        smart = self.runners["smart", ss.AUTOTUNE].rewrite
        summary = {
            "workload": self.workload,
            "samples": self.samples,
            "bounds": bounds,
            "limit_threads": k,
            "sides_ms": sides,
            "bounds_k": {key: Spread.of(b.get(key) for b in bounds) for key in
                         ("ideal", "limit", "limit_input", "limit_smart", "limit_available", "available_cores")},
            "settle": self.settle,
            "graphs": {f"{name} capacity {cap}": {"build_seconds": round(r.build_seconds, 2),
                                                  "nodes": len(r.graph.as_graph_def().node)}
                       for (name, cap), r in self.runners.items()},
            "smart_stage": {
                "rewrite_seconds": round(smart.seconds, 3) if smart else None,
                "moved": sum(len(s.moved) for s in smart.stages) if smart else 0,
                "boundary_tensors": sum(len(s.boundary) for s in smart.stages) if smart else 0,
            },
            "errors": self.errors,
        }
        summary.update(targets(summary))
        summary["fold_lanes"] = fold_lanes_rows(summary)
        if self.workload.device_ms > 0 or self.workload.gpu:
            summary.update(accelerator_targets(summary))
        return summary


ACCELERATOR_CONFIGS = "no_stage,staged,staged_fold,tfdata_prefetch,tfdata_map,smart,smart_lanes,auto_stage,auto_stage_lanes"
MODES = {
    # warmup: untimed steps before every block, on top of the batches the idle session buffered.
    # steps: a block; the smoke's 12 are enough that a pipeline produces during it (3 could all come from the buffer).
    # settle_seconds: AUTOTUNE stages train until the tuner settled, at most this long, before the first block
    # (once per session). The bound is time, not steps: the tuner judges windows of time (0.3-0.5 s), so a
    # step bound ran out before it settled on fast workloads (800 steps were ~4 s at DLRM-like 2 ms).
    "full": dict(rows=200_000, models="dlrm,wide_deep", variants="cpu,io,1core", repeats=5, steps=20,
                 warmup=4, grid=True, size="benchmark", batch_size=512, settle_seconds=60.0),
    "quick": dict(rows=200_000, models="dlrm", variants="cpu", repeats=5, steps=20, warmup=4, grid=False,
                  size="benchmark", batch_size=512, settle_seconds=60.0),
    "smoke": dict(rows=2_000, models="dlrm", variants="io", repeats=1, steps=12, warmup=2, grid=True,
                  size="small", batch_size=32, settle_seconds=20.0),
    # The accelerator family: defaults only, every configuration, per device time (--device-ms).
    # (SmartStage + the user's prefetch is left out: its own settling would cost ~10 s a workload.)
    "accelerator": dict(rows=200_000, models="dlrm,wide_deep", device_ms="2,5,10,20", repeats=5, steps=30, warmup=4,
                        grid=False, size="benchmark", batch_size=512, settle_seconds=60.0,
                        configs=ACCELERATOR_CONFIGS),
    "accelerator-quick": dict(rows=200_000, models="dlrm", device_ms="5", repeats=5, steps=30, warmup=4, grid=False,
                              size="benchmark", batch_size=512, settle_seconds=60.0,
                              configs=ACCELERATOR_CONFIGS),
    "accelerator-smoke": dict(rows=2_000, models="dlrm", device_ms="2", repeats=1, steps=12, warmup=2, grid=False,
                              size="small", batch_size=32, settle_seconds=30.0,
                              configs=ACCELERATOR_CONFIGS),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="DLRM-like, CPU-bound, default settings, 5 repeats (~2 min)")
    mode.add_argument("--smoke", action="store_true", help="a tiny DLRM-like model on 2,000 rows, a 2-point grid (a test)")
    parser.add_argument("--accelerator", action="store_true",
                        help="the emulated accelerator family: the model's compute as a host-idle wait (--device-ms)")
    parser.add_argument("--device-ms", help="comma-separated device times per step of --accelerator (default 2,5,10,20)")
    parser.add_argument("--gpu", action="store_true", help="with --accelerator: the real model on a real GPU, "
                                                           "SmartStage with do_smart_stage_gpu (no emulated wait)")
    parser.add_argument("--configs", help="comma-separated configurations (default: all; --accelerator: "
                                          "all but smart_prefetch); no_stage and smart always run, the bounds "
                                          "are measured from them")
    parser.add_argument("--rows", type=int, help="generated rows (default 200000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", help="comma-separated: dlrm,wide_deep")
    parser.add_argument("--variants", help="comma-separated: cpu (no storage latency), io (--latency-ms per batch), "
                                           "1core (cpu, one core per side: intra-op 1, a 1-thread pool per side)")
    parser.add_argument("--latency-ms", type=float, default=10.0, help="storage latency per batch of the io variant")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--steps", type=int, help="timed steps per block")
    parser.add_argument("--warmup", type=int, help="untimed steps before each block (+ the producer threads)")
    parser.add_argument("--settle-steps", type=int, help="most steps an AUTOTUNE stage may take to settle "
                                                         "(default: no step bound, only --settle-seconds)")
    parser.add_argument("--settle-seconds", type=float, help="most seconds an AUTOTUNE stage may take to settle")
    parser.add_argument("--capacities", default="4,40", help="capacities of the hand-tuned grid (default 4,40)")
    parser.add_argument("--no-grid", dest="grid", action="store_false", default=None, help="default settings only")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default benchmarks/out)")
    parser.add_argument("--publish", action="store_true",
                        help="also copy the report, JSON and PNG to docs/perf/ and write docs/perf/e2e-summary.md")
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.gpu and not args.accelerator:
        parser.error("--gpu runs the accelerator family: add --accelerator")
    if args.accelerator:
        args.mode = "accelerator" if args.mode == "full" else f"accelerator-{args.mode}"
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.configs is None:
        args.configs = ",".join(c.name for c in CONFIGS)
    names = [n for n in args.configs.split(",") if n]
    unknown = sorted(set(names) - set(CONFIGS_BY_NAME))
    if unknown:
        parser.error(f"--configs: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS_BY_NAME)}")
    # The bounds (the sides alone, the bare step, the limit) are measured from these two in every run.
    args.configs = ",".join(dict.fromkeys(["no_stage", "smart", *names]))
    if args.accelerator:
        args.variants = "gpu" if args.gpu else "device"
    args.capacities = (4,) if args.mode == "smoke" else tuple(int(c) for c in args.capacities.split(","))
    args.threads = (1,) if args.mode == "smoke" else (1, 2, 4)
    args.inter_ops = (0,) if args.mode == "smoke" else (0, 4)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started = time.perf_counter()
    machine = machine_info()
    files = prepare_data(args.out, args.rows, args.seed)
    workloads = []
    for model in args.models.split(",") if args.accelerator else ():
        times = [0.0] if args.gpu else [float(ms) for ms in args.device_ms.split(",")]
        workloads += [Workload(model, args.variants, 0.0, args.batch_size, args.size, device_ms=ms, gpu=args.gpu)
                      for ms in times]
    for model in args.models.split(",") if not args.accelerator else ():
        for variant in args.variants.split(","):
            latency = args.latency_ms if variant == "io" else 0.0
            workloads.append(Workload(model, "cpu" if variant == "1core" else variant, latency, args.batch_size,
                                      args.size, one_core_per_side=variant == "1core"))
    rng = random.Random(args.seed)
    summaries = []
    for workload in workloads:
        begun = time.perf_counter()
        _progress(f"{workload.name}: building {len(CONFIGS)} graphs")
        run = WorkloadRun(workload, files, args)
        run.run(rng)
        summary = run.summary()
        summary["seconds"] = round(time.perf_counter() - begun, 1)
        summaries.append(summary)
        _progress(f"{workload.name}: done in {summary['seconds']:.0f} s")
    machine["load_average_at_end"] = load_average()
    result = {
        "benchmark": "e2e",
        "command": "python -m benchmarks.e2e " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": args.mode,
        "machine": machine,
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {"rows": args.rows, "seed": args.seed, "path": files.data_path},
        "workloads": [{**s, "samples": {f"{n} [{setting.label}]": v for (n, setting), v in s["samples"].items()}}
                      for s in summaries],  # JSON keys are strings
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.accelerator:
        stem = "accelerator-gpu" if args.gpu else "accelerator"
        short = accelerator_markdown(result, summaries) if summaries else ""
        figure = accelerator_figure(result) if summaries and not args.gpu else None
        text = short + "\n" + report_text(result, summaries)
        paths = write_outputs(args.out, stem, result, figure, publish=args.publish, text=text)
    else:
        figure = plot(summaries) if summaries else None
        text = report_text(result, summaries)
        paths = write_outputs(args.out, "e2e", result, figure, publish=args.publish, text=text)
        short = summary_markdown(result, summaries)
        (args.out / "e2e-summary-latest.md").write_text(short)
        if args.publish:
            (PUBLISH_DIR / "e2e-summary.md").write_text(short)
            paths.append(PUBLISH_DIR / "e2e-summary.md")
    if args.publish:  # the dated report beside the latest one: docs/perf/<stem>-<YYYY-MM-DD>.md
        dated = PUBLISH_DIR / f"{stem if args.accelerator else 'e2e'}-{time.strftime('%Y-%m-%d')}.md"
        dated.write_text(short + "\n" + text if not args.accelerator else text)
        paths.append(dated)
    print(text, end="")
    print(f"\nTotal {result['seconds']:.0f} s. Wrote: {', '.join(str(p) for p in paths)}")
    return 1 if any(s["errors"] for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
