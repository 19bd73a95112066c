"""End-to-end benchmark: global steps/sec of DLRM-like and Wide&Deep-like training, every configuration.

    python -m benchmarks.e2e            # both models, CPU-bound and I/O-bound input, grid, 3 repeats (< 10 min)
    python -m benchmarks.e2e --quick    # DLRM-like, CPU-bound, default settings, 4 repeats (< 2 min)
    python -m benchmarks.e2e --smoke    # tiny models on 2,000 rows: checks that everything runs (the test)

Data: 200,000 synthetic Criteo-like rows (seed 0), written once to benchmarks/out/data/. Each
workload (a model, with or without storage latency on the read) builds one graph per
configuration (see benchmarks/runners.py), opens one session per grid point (and for the two
sides of the step run alone), then in every repeat times one block of steps of each, in a new
shuffled order: every configuration sees the same machine, however busy it is. A configuration's
"best" setting is the grid point with the highest median; its "default" is what a user gets.

Reported per configuration: median global steps/sec (range over repeats), the median of the
per-repeat ratio to no stage (both measured in the same repeat), the fraction of the ideal bound
1/max(T_in, T_train) and of the limit min(1/max(T_in/k, T_train), cores/(cpu_in + cpu_train)),
with T and cpu the wall and CPU seconds per step of each side run alone. Writes
benchmarks/out/e2e-<time>.json and .png (and e2e-latest.*); --publish copies them to docs/perf/.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from benchmarks.report import (  # noqa: E402
    DEFAULT_OUT,
    available_cores,
    REPO_ROOT,
    Spread,
    load_average,
    machine_info,
    machine_line,
    markdown_table,
    pyplot,
    write_outputs,
)
from benchmarks.runners import (  # noqa: E402
    ALTERNATIVES,
    CONFIGS,
    DEFAULT_SETTING,
    SMART,
    ConfigRunner,
    Setting,
    Sides,
    SidesRunner,
    Workload,
    grid_for,
    smart_split,
)
from smartstage.examples import CATEGORICAL_COLUMNS, CriteoFiles, prepare_criteo  # noqa: E402

logger = logging.getLogger("benchmarks.e2e")

SPLITS = ("input", "smart")
TARGET_OF_LIMIT = 0.9
TARGET_VS_BEST_ALTERNATIVE = 1.1


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
        self.runners: dict[str, ConfigRunner] = {}
        for config in CONFIGS:
            self.runners[config.name] = ConfigRunner(config, workload, files)
        self.sides_runner = SidesRunner(self.runners["no_stage"], smart_split(self.runners["smart"]))
        self.errors += self.sides_runner.notes
        self.points = [(c.name, s) for c in CONFIGS
                       for s in (grid_for(c, args.threads, args.inter_ops) if args.grid else [DEFAULT_SETTING])]
        self.finalists: dict[str, list[Setting]] = {}
        self.samples: dict[tuple[str, Setting], list] = {point: [] for point in self.points}
        self.sides: list[dict[str, Sides]] = []
        self.cores: list[float] = []  # available_cores() of each repeat, beside its sides

    def _error(self, what: str, error: Exception) -> None:
        message = f"{self.workload.name} {what}: {type(error).__name__}: {error}"
        logger.exception("measurement failed: %s", message)
        self.errors.append(message)

    def run(self, rng: random.Random) -> None:
        """Opens every grid point's session, then times one block of each per repeat, in shuffled order."""
        opened = {}
        for config, setting in self.points:
            try:
                opened[(config, setting)] = self.runners[config].open(setting)
            except Exception as error:  # noqa: BLE001  one failing configuration must not end the run
                self._error(f"{config} [{setting.label}] (open)", error)
        self.sides_runner.open()
        # A block's warm-up drains what the idle session buffered: capacity + producer threads batches
        # of the stage, and tf.data's prefetch buffer.
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
                        continue
                    name, setting = item
                    try:
                        sample = opened[item].sample(warmup + setting.threads, self.args.steps)
                    except Exception as error:  # noqa: BLE001
                        self._error(f"{name} [{setting.label}]", error)
                        sample = None
                    self.samples[item].append(sample)
                    if sample is not None and sample.global_steps != warmup + setting.threads + self.args.steps:
                        self.errors.append(f"{self.workload.name} {name}: global_step advanced {sample.global_steps}, "
                                           f"expected {warmup + setting.threads + self.args.steps}")
                    _progress(f"  repeat {repeat + 1} {name:16} {setting.label:48} "
                              f"{sample.steps_per_sec if sample else float('nan'):7.1f} steps/s "
                              f"cpu {sample.cpu_ms_per_step if sample else float('nan'):6.1f} ms/step")
        finally:
            for run in opened.values():
                run.close()
            self.sides_runner.close()
        for c in CONFIGS:
            scored = [(Spread.of(s.steps_per_sec for s in samples if s is not None).median, setting)
                      for (name, setting), samples in self.samples.items() if name == c.name]
            scored = [(v, s) for v, s in scored if v == v]
            best = max(scored, key=lambda item: item[0])[1] if scored else DEFAULT_SETTING
            self.finalists[c.name] = [DEFAULT_SETTING] + ([best] if best != DEFAULT_SETTING else [])

    # -- derived numbers ------------------------------------------------------------------------

    def _bounds(self, repeat: int, k: int) -> dict[str, float]:
        """The bounds of one repeat for k producer threads.

        ideal: 1/max(T_in, T_train) of the input pipeline | model split. limit_<split>:
        min(1/max(T_in/k, T_train), cores/(cpu_in + cpu_train)) with the machine's cores; limit: the
        higher over both splits (SmartStage's cut usually has the shorter training side).
        limit_available: the same with the cores measured free in that repeat (a shared machine).
        """
        if repeat >= len(self.sides):
            return {}
        sides = self.sides[repeat]
        cores = os.cpu_count() or 1
        free = self.cores[repeat] if repeat < len(self.cores) else cores
        out = {"available_cores": free}
        if "input" in sides:
            s = sides["input"]
            out["ideal"] = 1.0 / max(s.t_in, s.t_train)
        limits, available = [], []
        for name, s in sides.items():
            pipeline = 1.0 / max(s.t_in / k, s.t_train)
            out[f"limit_{name}"] = min(pipeline, cores / (s.cpu_in + s.cpu_train))
            limits.append(out[f"limit_{name}"])
            available.append(min(pipeline, free / (s.cpu_in + s.cpu_train)))
        if limits:
            out["limit"] = max(limits)
            out["limit_available"] = max(available)
        return out

    def summary(self) -> dict[str, Any]:
        baseline = self.samples.get(("no_stage", DEFAULT_SETTING), [])
        rows = {}
        for c in CONFIGS:
            rows[c.name] = {"label": c.label, "settings": []}
            for setting in self.finalists.get(c.name, [DEFAULT_SETTING]):
                samples = self.samples.get((c.name, setting), [])
                k = setting.threads if c.has_stage else 1
                ratio, ideal, limit, limit_free = [], [], [], []
                for r, sample in enumerate(samples):
                    if sample is None:
                        continue
                    if r < len(baseline) and baseline[r] is not None:
                        ratio.append(sample.steps_per_sec / baseline[r].steps_per_sec)
                    bounds = self._bounds(r, k)
                    if "ideal" in bounds:
                        ideal.append(sample.steps_per_sec / bounds["ideal"])
                    if "limit" in bounds:
                        limit.append(sample.steps_per_sec / bounds["limit"])
                        limit_free.append(sample.steps_per_sec / bounds["limit_available"])
                ok = [s for s in samples if s is not None]
                rows[c.name]["settings"].append({
                    "setting": setting,
                    "label": setting.label,
                    "is_default": setting == DEFAULT_SETTING,
                    "steps_per_sec": Spread.of(s.steps_per_sec for s in ok),
                    "cpu_ms_per_step": Spread.of(s.cpu_ms_per_step for s in ok),
                    "vs_no_stage": Spread.of(ratio),
                    "of_ideal": Spread.of(ideal),
                    "of_limit": Spread.of(limit),
                    "of_limit_available": Spread.of(limit_free),
                    "samples": samples,
                })
        sides = {name: {field: Spread.of(getattr(s[name], field) * 1000 for s in self.sides if name in s)
                        for field in ("t_in", "t_train", "cpu_in", "cpu_train")} for name in SPLITS}
        bounds = [self._bounds(r, 1) for r in range(len(self.sides))]
        smart = self.runners["smart"].rewrite
        return {
            "workload": self.workload,
            "rows": rows,
            "sides_ms": sides,
            "bounds_k1": {key: Spread.of(b.get(key) for b in bounds) for key in
                          ("ideal", "limit", "limit_input", "limit_smart", "limit_available", "available_cores")},
            "targets": self.targets(rows),
            "graphs": {name: {"build_seconds": round(r.build_seconds, 2),
                              "nodes": len(r.graph.as_graph_def().node)} for name, r in self.runners.items()},
            "smart_stage": {
                "rewrite_seconds": round(smart.seconds, 3) if smart else None,
                "moved": sum(len(s.moved) for s in smart.stages) if smart else 0,
                "boundary_tensors": sum(len(s.boundary) for s in smart.stages) if smart else 0,
                "boundary_tensors_before": len(self.runners["staged"].stage_def.boundary_tensors),
            },
            "grid": [{"config": name, "setting": s, "label": s.label,
                      "steps_per_sec": Spread.of(x.steps_per_sec for x in v if x is not None)}
                     for (name, s), v in self.samples.items()],
            "sides_samples": self.sides,
            "errors": self.errors,
        }

    @staticmethod
    def targets(rows: dict[str, Any]) -> dict[str, Any]:
        def median(name: str, default_only: bool) -> float:
            settings = rows[name]["settings"]
            values = [s["steps_per_sec"].median for s in settings if s["is_default"] or not default_only]
            values = [v for v in values if v == v]
            return max(values) if values else float("nan")

        best_alternative = max(ALTERNATIVES, key=lambda n: median(n, False))
        out: dict[str, Any] = {"best_alternative": best_alternative,
                               "best_alternative_steps_per_sec": median(best_alternative, False)}
        for name in SMART:
            default = next(s for s in rows[name]["settings"] if s["is_default"])
            vs_best = default["steps_per_sec"].median / out["best_alternative_steps_per_sec"]
            out[name] = {
                "of_limit": default["of_limit"].median,
                "of_limit_met": default["of_limit"].median >= TARGET_OF_LIMIT,
                "vs_best_alternative": vs_best,
                "vs_best_alternative_met": vs_best >= TARGET_VS_BEST_ALTERNATIVE,
                "vs_no_stage": default["vs_no_stage"].median,
                "never_slower_than_no_stage_met": default["vs_no_stage"].median >= 1.0,
            }
        return out


def workload_table(summary: dict[str, Any]) -> str:
    header = ["configuration", "setting", "global steps/s", "x no stage", "of ideal", "of limit",
              "of limit (free cores)", "CPU ms/step"]
    rows = []
    for name, row in summary["rows"].items():
        for s in row["settings"]:
            rows.append([
                row["label"] if s["is_default"] else "",
                "default" if s["is_default"] else f"best: {s['label']}",
                s["steps_per_sec"].text(1), s["vs_no_stage"].text(2), s["of_ideal"].text(2),
                s["of_limit"].text(2), s["of_limit_available"].text(2), s["cpu_ms_per_step"].text(1),
            ])
    return markdown_table(header, rows)


def sides_line(summary: dict[str, Any]) -> str:
    parts = []
    for split, label in (("input", "input pipeline | model"), ("smart", "SmartStage's cut")):
        s = summary["sides_ms"][split]
        if s["t_in"].n:
            parts.append(f"{label}: input side {s['t_in'].median:.1f} ms (CPU {s['cpu_in'].median:.1f}), "
                         f"training side {s['t_train'].median:.1f} ms (CPU {s['cpu_train'].median:.1f})")
    b = summary["bounds_k1"]
    parts.append(f"ideal bound {b['ideal'].median:.1f} steps/s, limit (k=1) {b['limit'].median:.1f} steps/s "
                 f"({b['limit_available'].median:.1f} with the {b['available_cores'].median:.2f} cores measured free)")
    return "; ".join(parts)


def targets_text(summary: dict[str, Any]) -> str:
    t = summary["targets"]
    lines = [f"best alternative: {t['best_alternative']} ({t['best_alternative_steps_per_sec']:.1f} steps/s at its best)"]
    for name in SMART:
        x = t[name]
        mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        lines.append(f"{name} (defaults): {x['of_limit']:.2f} of the limit ({mark(x['of_limit_met'])}, target "
                     f">= {TARGET_OF_LIMIT}); {x['vs_best_alternative']:.2f}x the best alternative "
                     f"({mark(x['vs_best_alternative_met'])}, target >= {TARGET_VS_BEST_ALTERNATIVE}); "
                     f"{x['vs_no_stage']:.2f}x no stage ({mark(x['never_slower_than_no_stage_met'])}, target >= 1)")
    return "\n".join(lines)


def plot(summaries: list[dict[str, Any]]):
    plt = pyplot()
    if plt is None:
        logger.warning("matplotlib is not installed (pip install -e '.[report]'): no PNG")
        return None
    fig, axes = plt.subplots(1, len(summaries), figsize=(5.2 * len(summaries), 4.6), squeeze=False)
    for ax, summary in zip(axes[0], summaries):
        names = list(summary["rows"])
        for j, kind in enumerate(("default", "best")):
            xs, ys, lo, hi = [], [], [], []
            for i, name in enumerate(names):
                settings = summary["rows"][name]["settings"]
                s = settings[0] if kind == "default" else settings[-1]
                sp = s["steps_per_sec"]
                if sp.n:
                    xs.append(i + (j - 0.5) * 0.38)
                    ys.append(sp.median)
                    lo.append(sp.median - sp.low)
                    hi.append(sp.high - sp.median)
            ax.bar(xs, ys, width=0.36, yerr=[lo, hi], capsize=3, label=f"{kind} setting",
                   color=("#4C72B0" if kind == "default" else "#DD8452"))
        bounds = summary["bounds_k1"]
        if bounds["ideal"].n:
            ax.axhline(bounds["ideal"].median, color="green", linestyle="--", label="ideal bound")
        if bounds["limit"].n:
            ax.axhline(bounds["limit"].median, color="red", linestyle=":", label="limit (k=1)")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_ylabel("global steps/sec (median, range)")
        ax.set_title(summary["workload"].name)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


MODES = {
    # warmup: untimed steps before every block; they drain what the idle session buffered (capacity +
    # producer threads batches, tf.data's prefetch buffer) before the clock starts.
    "full": dict(rows=200_000, models="dlrm,wide_deep", variants="cpu,io", repeats=3, steps=15,
                 warmup=4, grid=True, size="benchmark", batch_size=512),
    "quick": dict(rows=200_000, models="dlrm", variants="cpu", repeats=4, steps=20,
                  warmup=5, grid=False, size="benchmark", batch_size=512),
    "smoke": dict(rows=2_000, models="dlrm", variants="io", repeats=1, steps=3,
                  warmup=2, grid=True, size="small", batch_size=32),
}


def report_text(result: dict[str, Any], summaries: list[dict[str, Any]]) -> str:
    """The printed report, in Markdown (also written beside the JSON): per workload the two sides
    alone, the table, and the targets."""
    machine = result["machine"]
    lines = [f"# End-to-end benchmark ({result['mode']}): {result['command']}",
             f"Machine: {machine_line(machine)}; load average at end {machine['load_average_at_end']}"]
    for summary in summaries:
        w = summary["workload"]
        lines += ["", f"## {w.name}: batch {w.batch_size}, read latency {w.read_latency_ms:g} ms/batch, "
                      f"{summary['seconds']:.0f} s",
                  sides_line(summary), "", workload_table(summary), "", targets_text(summary)]
        lines += [f"ERROR: {error}" for error in summary["errors"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="DLRM-like, CPU-bound, default settings, 4 repeats (< 2 min)")
    mode.add_argument("--smoke", action="store_true", help="a tiny DLRM-like model on 2,000 rows, a 2-point grid (a test)")
    parser.add_argument("--rows", type=int, help="generated rows (default 200000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", help="comma-separated: dlrm,wide_deep")
    parser.add_argument("--variants", help="comma-separated: cpu (no storage latency), io (--latency-ms per batch)")
    parser.add_argument("--latency-ms", type=float, default=10.0, help="storage latency per batch of the io variant")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--steps", type=int, help="timed steps per block")
    parser.add_argument("--warmup", type=int, help="untimed steps before each block (+ the producer threads)")
    parser.add_argument("--no-grid", dest="grid", action="store_false", default=None, help="default settings only")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default benchmarks/out)")
    parser.add_argument("--publish", action="store_true", help="also copy the JSON and PNG to docs/perf/")
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.threads = (1,) if args.mode == "smoke" else (1, 2, 4)
    args.inter_ops = (0,) if args.mode == "smoke" else (0, 4)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started = time.perf_counter()
    machine = machine_info()
    files = prepare_data(args.out, args.rows, args.seed)
    workloads = []
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            latency = args.latency_ms if variant == "io" else 0.0
            workloads.append(Workload(model, variant, latency, args.batch_size, args.size))
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
        "workloads": summaries,
        "seconds": round(time.perf_counter() - started, 1),
    }
    figure = plot(summaries) if summaries else None
    text = report_text(result, summaries)
    paths = write_outputs(args.out, "e2e", result, figure, publish=args.publish, text=text)
    print(text, end="")
    print(f"\nTotal {result['seconds']:.0f} s. Wrote: {', '.join(str(p) for p in paths)}")
    return 1 if any(s["errors"] for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
