"""DeepRec model-zoo-style scripts (tests/compat/zoo/) with SmartStage off and on: training steps/s.

    python -m benchmarks.ports            # 4 scripts x 3 runs, 20,000 rows, 800 steps, 5 interleaved repeats
    python -m benchmarks.ports --quick    # dlrm only, 2 repeats, 80 steps
    python -m benchmarks.ports --smoke    # one script, 1 repeat, a few steps (the test)

Each run is the script's own main() (as `python <script> --optimizer adam --parquet_dataset False
--no_eval ...` would run it, see tests/compat/zoo_runner.py), in a fresh graph, on a synthetic
Criteo-format train.csv written once to benchmarks/out/data/. Runs, per script:

    flag off      --do_smart_stage False: the same staged graph, no rewrite (the baseline)
    on, 4/40      the flag on at the scripts' own setting: staged(next_element, num_threads=4, capacity=40)
    on, defaults  the flag on with staged(next_element) (num_threads = capacity = AUTOTUNE): the script's
                  `tf.staged` is wrapped to drop the two arguments; the script file is not changed

Steps/s is timed by a SessionRunHook added to the script's training hooks, twice per run: "first steps",
from step --skip (session start, checkpoint) to step --early-end, while AUTOTUNE still measures and the
producer builds its executors (the window earlier runs reported); and "steady", from step --steady-from
to the last step, once the tuner settled (a training job's thousands of steps look like this). Repeats run every (script, run) pair in a
new random order; the ratio to flag off is taken within each repeat. Writes benchmarks/out/ports-*.{json,md};
--publish copies the Markdown table to docs/perf/ports.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from benchmarks.report import DEFAULT_OUT, Spread, machine_info, machine_line, markdown_table, write_outputs  # noqa: E402
from smartstage.examples.data import write_criteo_csv  # noqa: E402
from tests.compat.zoo_runner import MODELS, load_zoo  # noqa: E402

RUNS = {"off": ["--do_smart_stage", "False"], "on 4/40": ["--stage_threads", "4"], "on defaults": []}


class _DefaultsTF:
    """The script's `tf`, with staged() at its defaults (AUTOTUNE): num_threads and capacity dropped."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def staged(self, features, num_threads=None, capacity=None, **kwargs):  # noqa: ARG002  the script's values
        return self._real.staged(features, **kwargs)


class _StepTimer(tf.compat.v1.train.SessionRunHook):
    """When each step ended: steps/s between any two step counts."""

    def __init__(self):
        self.steps, self.ended = 0, {}

    def after_run(self, run_context, run_values):
        self.steps += 1
        self.ended[self.steps] = time.perf_counter()

    def rate(self, start: int, end: Optional[int] = None) -> Optional[float]:
        end = self.steps if end is None else min(end, self.steps)
        if start not in self.ended or end <= start:
            return None
        return (end - start) / (self.ended[end] - self.ended[start])


def run_once(model: str, run: str, data_dir: str, args: argparse.Namespace) -> tuple[Optional[float], Optional[float]]:
    """One training run of a script; its steps/s over the first steps and once steady."""
    names = load_zoo(model)
    timer = _StepTimer()
    globals_ = names["main"].__globals__
    train = globals_["train"]
    globals_["train"] = lambda cfg, hooks, *rest: train(cfg, [*hooks, timer], *rest)
    if run == "on defaults":
        globals_["tf"] = _DefaultsTF(globals_["tf"])
    with tempfile.TemporaryDirectory() as ckpt:
        argv = ["--data_location", data_dir, "--checkpoint", ckpt, "--optimizer", "adam", "--parquet_dataset",
                "False", "--no_eval", "--batch_size", str(args.batch_size), "--steps", str(args.steps), *RUNS[run]]
        graph = tf.Graph()
        with graph.as_default():
            globals_["args"] = names["get_arg_parser"]().parse_args(argv)
            names["main"]()
    return timer.rate(args.skip, args.early_end), timer.rate(args.steady_from)


def prepare(out: Path, rows: int) -> str:
    where = out / "data" / f"zoo-{rows}"
    if not (where / "train.csv").exists():
        where.mkdir(parents=True, exist_ok=True)
        write_criteo_csv(where / "train.csv", rows, seed=1)
        write_criteo_csv(where / "eval.csv", 256, seed=2)
    return str(where)


MODES = {"full": dict(models=",".join(MODELS), repeats=5, rows=20_000, steps=800, skip=60, early_end=300,
                     steady_from=400, batch_size=512),
         "quick": dict(models="dlrm", repeats=2, rows=20_000, steps=500, skip=30, early_end=200, steady_from=250,
                       batch_size=512),
         "smoke": dict(models="dlrm", repeats=1, rows=400, steps=16, skip=4, early_end=8, steady_from=10,
                       batch_size=32)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ports", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    for flag, kind in (("--models", str), ("--repeats", int), ("--rows", int), ("--steps", int), ("--skip", int),
                       ("--early-end", int), ("--steady-from", int), ("--batch-size", int)):
        parser.add_argument(flag, type=kind)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--publish", action="store_true", help="also copy the table to docs/perf/ports.md")
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started, machine = time.perf_counter(), machine_info()
    data_dir = prepare(args.out, args.rows)
    pairs = [(m, r) for m in args.models.split(",") for r in RUNS]
    rates: dict[tuple[str, str], list] = {p: [] for p in pairs}    # first steps
    steady: dict[tuple[str, str], list] = {p: [] for p in pairs}   # once settled
    errors: list[str] = []
    rng = random.Random(args.seed)
    for repeat in range(args.repeats):
        rng.shuffle(pairs)
        for model, run in pairs:
            try:
                early, late = run_once(model, run, data_dir, args)
            except Exception as error:  # noqa: BLE001  one failing run must not end the benchmark
                errors.append(f"{model} {run}: {type(error).__name__}: {error}")
                early = late = None
            rates[(model, run)].append(early)
            steady[(model, run)].append(late)
            print(f"  repeat {repeat + 1} {model:14} {run:12} {early or float('nan'):7.1f} steps/s first steps, "
                  f"{late or float('nan'):7.1f} steady", file=sys.stderr)

    def table(measured: dict) -> str:
        rows = []
        for model in args.models.split(","):
            off = measured[(model, "off")]
            cells = [model]
            for run in RUNS:
                cells.append(Spread.of(measured[(model, run)]).text(1))
                if run != "off":
                    cells.append(Spread.of(a / b for a, b in zip(measured[(model, run)], off) if a and b).text(2))
            rows.append(cells)
        return markdown_table(["script", "flag off steps/s", "on, 4 threads / capacity 40", "x off",
                               "on, defaults (AUTOTUNE)", "x off"], rows)

    command = "python -m benchmarks.ports " + " ".join(argv if argv is not None else sys.argv[1:])
    seconds = time.perf_counter() - started
    text = "\n".join([
        f"Measured by `{command.strip()}` in {seconds:.0f} s on {machine_line(machine)} ({machine['date']}); "
        f"{args.rows} rows, batch {args.batch_size}, {args.steps} steps a run, "
        f"{args.repeats} interleaved repeats, median (range); ratios to flag off within each repeat.", "",
        f"**Steady** (steps {args.steady_from} to {args.steps}: AUTOTUNE settled, executors built):", "",
        table(steady), "",
        f"**First steps** (steps {args.skip} to {args.early_end}: AUTOTUNE measuring, the producer building its "
        "executors):", "", table(rates), "", *[f"ERROR: {e}" for e in errors]]) + "\n"
    result = {"benchmark": "ports", "command": command, "machine": machine, "parameters": vars(args) | {"out": str(args.out)},
              "rates": {f"{m} {r}": v for (m, r), v in rates.items()},
              "steady": {f"{m} {r}": v for (m, r), v in steady.items()}, "errors": errors, "seconds": round(seconds, 1)}
    paths = write_outputs(args.out, "ports", result, None, publish=args.publish, text=text)
    print(text, end="")
    print(f"Wrote: {', '.join(str(p) for p in paths)}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
