"""DeepRec model-zoo-style scripts (tests/compat/zoo/) with SmartStage off and on: training steps/s.

    python -m benchmarks.ports            # 4 scripts x 3 runs, 20,000 rows, 1,000 steps, 5 interleaved repeats
    python -m benchmarks.ports --first    # the first steps: dlrm, wide_and_deep, flag off vs on at the defaults, 3 repeats
    python -m benchmarks.ports --quick    # dlrm only, 2 repeats, 500 steps
    python -m benchmarks.ports --smoke    # one script, 1 repeat, a few steps (the test)

Each run is the script's own main() (as `python <script> --optimizer adam --parquet_dataset False
--no_eval ...` would run it, see tests/compat/zoo_runner.py), in a fresh graph, on a synthetic
Criteo-format train.csv written once to benchmarks/out/data/. Runs, per script:

    flag off      --do_smart_stage False: the same staged graph, no rewrite (the baseline)
    on, 4/40      the flag on at the scripts' own setting: staged(next_element, num_threads=4, capacity=40)
    on, defaults  the flag on with staged(next_element) (num_threads = capacity = AUTOTUNE): the script's
                  `tf.staged` is wrapped to drop the two arguments; the script file is not changed

Steps/s is timed by a SessionRunHook added to the script's training hooks: "first 100" and "first 1,000",
from the session ready (after_create_session) to step 100 and 1,000, the first step's executor builds and
AUTOTUNE's first trials included (what a user trying the flag for a minute sees); "startup", the
seconds from main() to the session ready (graph, rewrite, session, prefetch threads), reported beside them;
steps --skip to --early-end (while AUTOTUNE tries settings and the executors are built); and "steady", from step
--steady-from to the last step, once the tuner settled (a training job's thousands of steps look like this). Repeats run every (script, run) pair in a
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
    """When the session was ready and when each step ended: steps/s between any two step counts (0: ready)."""

    def __init__(self):
        self.steps, self.ended = 0, {}
        self.started = time.perf_counter()  # main() called: the graph is built and the session created after

    def after_create_session(self, session, coord):
        self.ended[0] = time.perf_counter()

    def after_run(self, run_context, run_values):
        self.steps += 1
        self.ended[self.steps] = time.perf_counter()

    def rate(self, start: int, end: Optional[int] = None) -> Optional[float]:
        end = self.steps if end is None else end
        if start not in self.ended or end not in self.ended or end <= start:
            return None
        return (end - start) / (self.ended[end] - self.ended[start])

    def startup(self) -> Optional[float]:
        """Seconds from main() to the session ready (graph, rewrite, session, hooks, prefetch threads)."""
        return self.ended[0] - self.started if 0 in self.ended else None


def run_once(model: str, run: str, data_dir: str, args: argparse.Namespace) -> dict[str, Optional[float]]:
    """One training run of a script: steps/s over its first steps (from the session ready: steps 1-100 and
    1-1,000), over steps --skip to --early-end and once steady, and the seconds to the session ready."""
    names = load_zoo(model)
    globals_ = names["main"].__globals__
    train = globals_["train"]
    globals_["train"] = lambda cfg, hooks, *rest: train(cfg, [*hooks, timer], *rest)
    if run == "on defaults":
        globals_["tf"] = _DefaultsTF(globals_["tf"])
    timer = _StepTimer()
    with tempfile.TemporaryDirectory() as ckpt:
        argv = ["--data_location", data_dir, "--checkpoint", ckpt, "--optimizer", "adam", "--parquet_dataset",
                "False", "--no_eval", "--batch_size", str(args.batch_size), "--steps", str(args.steps), *RUNS[run]]
        graph = tf.Graph()
        with graph.as_default():
            globals_["args"] = names["get_arg_parser"]().parse_args(argv)
            names["main"]()
    return {"early": timer.rate(args.skip, args.early_end), "steady": timer.rate(args.steady_from),
            **{f"first {n}": timer.rate(0, n) for n in args.first_steps}, "startup": timer.startup()}


def prepare(out: Path, rows: int) -> str:
    where = out / "data" / f"zoo-{rows}"
    if not (where / "train.csv").exists():
        where.mkdir(parents=True, exist_ok=True)
        write_criteo_csv(where / "train.csv", rows, seed=1)
        write_criteo_csv(where / "eval.csv", 256, seed=2)
    return str(where)


MODES = {"full": dict(models=",".join(MODELS), repeats=5, rows=20_000, steps=1000, skip=60, early_end=300,
                     steady_from=400, batch_size=512, runs=",".join(RUNS), first_steps=(100, 1000)),
         # the first steps, flag off against on at the defaults: two scripts, 1,000 steps, 30 min publish window
         "first": dict(models="dlrm,wide_and_deep", repeats=3, rows=20_000, steps=1000, skip=60, early_end=300,
                       steady_from=400, batch_size=512, runs="off,on defaults", first_steps=(100, 1000)),
         "quick": dict(models="dlrm", repeats=2, rows=20_000, steps=500, skip=30, early_end=200, steady_from=250,
                       batch_size=512, runs=",".join(RUNS), first_steps=(100,)),
         "smoke": dict(models="dlrm", repeats=1, rows=400, steps=16, skip=4, early_end=8, steady_from=10,
                       batch_size=32, runs=",".join(RUNS), first_steps=(8,))}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ports", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    mode.add_argument("--first", action="store_true", help="the first steps: dlrm and wide_and_deep, flag off and "
                                                           "on at the defaults, 1,000 steps, 3 repeats")
    for flag, kind in (("--runs", str), ("--models", str), ("--repeats", int), ("--rows", int), ("--steps", int), ("--skip", int),
                       ("--early-end", int), ("--steady-from", int), ("--batch-size", int)):
        parser.add_argument(flag, type=kind)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--publish", action="store_true", help="also copy the table to docs/perf/ports.md "
                                                               "(--first: docs/perf/ports-first.md)")
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "first" if args.first else "full"
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started, machine = time.perf_counter(), machine_info()
    data_dir = prepare(args.out, args.rows)
    runs = [r for r in RUNS if r in args.runs.split(",")]
    pairs = [(m, r) for m in args.models.split(",") for r in runs]
    windows = ("early", "steady", *(f"first {n}" for n in args.first_steps), "startup")
    measured: dict[str, dict[tuple[str, str], list]] = {w: {p: [] for p in pairs} for w in windows}
    errors: list[str] = []
    rng = random.Random(args.seed)
    for repeat in range(args.repeats):
        rng.shuffle(pairs)
        for model, run in pairs:
            try:
                got = run_once(model, run, data_dir, args)
            except Exception as error:  # noqa: BLE001  one failing run must not end the benchmark
                errors.append(f"{model} {run}: {type(error).__name__}: {error}")
                got = {}
            for window in windows:
                measured[window][(model, run)].append(got.get(window))
            nan = float("nan")
            firsts = ", ".join(f"first {n} {got.get(f'first {n}') or nan:6.1f}" for n in args.first_steps)
            print(f"  repeat {repeat + 1} {model:14} {run:12} startup {got.get('startup') or nan:5.1f} s, {firsts}, steps "
                  f"{args.skip}-{args.early_end} {got.get('early') or nan:6.1f}, steady {got.get('steady') or nan:6.1f} "
                  "steps/s", file=sys.stderr)
    labels = {"off": "flag off", "on 4/40": "on, 4 threads / capacity 40", "on defaults": "on, defaults (AUTOTUNE)"}

    def table(window: dict, digits: int = 1, ratio: bool = True) -> str:
        rows = []
        for model in args.models.split(","):
            off = window[(model, "off")]
            cells = [model]
            for run in runs:
                cells.append(Spread.of(window[(model, run)]).text(digits))
                if run != "off" and ratio:
                    cells.append(Spread.of(a / b for a, b in zip(window[(model, run)], off) if a and b).text(2))
            rows.append(cells)
        header = ["script"] + [h for run in runs for h in ([labels[run]] + (["x off"] if run != "off" and ratio
                                                                               else []))]
        return markdown_table(header, rows)

    command = "python -m benchmarks.ports " + " ".join(argv if argv is not None else sys.argv[1:])
    seconds = time.perf_counter() - started
    text = "\n".join([
        f"Measured by `{command.strip()}` in {seconds:.0f} s on {machine_line(machine)} ({machine['date']}); "
        f"{args.rows} rows, batch {args.batch_size}, {args.steps} steps a run, "
        f"{args.repeats} interleaved repeats, median (range); ratios to flag off within each repeat.", "",
        *[line for n in args.first_steps for line in (
            f"**First {n:,} steps** (steps/s from the session ready to step {n:,}: the first step's executors and "
            "AUTOTUNE's first trials included):", "", table(measured[f"first {n}"]), "")],
        "**Startup** (seconds from main() to the session ready: graph, rewrite, session, hooks, prefetch threads; "
        "not in the rates above):", "", table(measured["startup"], 1, ratio=False), "",
        f"**Steady** (steps {args.steady_from} to {args.steps}: AUTOTUNE settled, executors built):", "",
        table(measured["steady"]), "",
        f"**Steps {args.skip} to {args.early_end}** (the window earlier runs reported as first steps):", "",
        table(measured["early"]), "", *[f"ERROR: {e}" for e in errors]]) + "\n"
    result = {"benchmark": "ports", "command": command, "machine": machine,
              "parameters": vars(args) | {"out": str(args.out)},
              **{window: {f"{m} {r}": v for (m, r), v in values.items()} for window, values in measured.items()},
              "errors": errors, "seconds": round(seconds, 1)}
    stem = "ports-first" if args.mode == "first" else "ports"  # --first publishes beside the full run's table
    paths = write_outputs(args.out, stem, result, None, publish=args.publish, text=text)
    print(text, end="")
    print(f"Wrote: {', '.join(str(p) for p in paths)}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
