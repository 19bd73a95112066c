"""A second session of the same graph (evaluation after training), SmartStage's flag off and on: what it costs.

    python -m benchmarks.second_session            # wide_and_deep, 5 interleaved repeats
    python -m benchmarks.second_session --quick    # 3 repeats
    python -m benchmarks.second_session --smoke    # 1 repeat, a few rows and steps (the test)

Each run is a model-zoo-style script's main() (tests/compat/zoo/, as benchmarks/ports.py runs them), in a
process of its own (the first session of a process pays TensorFlow's one-time start-up): --steps training steps in a MonitoredTrainingSession, then the whole eval.csv in a MonitoredSession of
the same graph, which finds the rewrite and the lane ops of the first session and builds its executors again
(they belong to a session). Per session: wall seconds of the script's train() / eval() (session creation,
restore, steps, close), process CPU seconds over the same span, and the stage producer's executor builds and
their CPU (PrefetchThreads.executor_builds). Runs: `off` (--do_smart_stage False: the same staged graph, no
rewrite) and `on`, the order alternating per repeat; the on / off ratios are taken within each repeat, and
the evaluation's accuracy and AUC and the training losses are compared between the two. Writes
benchmarks/out/second_session-*.{json,md}; --publish copies them to docs/perf/second_session.*.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from benchmarks.report import DEFAULT_OUT, Spread, machine_info, machine_line, markdown_table, write_outputs  # noqa: E402
from smartstage.examples.data import write_criteo_csv  # noqa: E402
from smartstage.runtime.lanes.producers.prefetch_threads import latest_prefetch_threads  # noqa: E402
from tests.compat.zoo_runner import load_zoo  # noqa: E402

RUNS = {"off": ["--do_smart_stage", "False"], "on": ["--do_smart_stage", "True"]}
SESSIONS = ("train", "eval")
MEASURES = ("wall", "cpu", "builds", "build_cpu")


class _Builds(tf.compat.v1.train.SessionRunHook):
    """The session's prefetch threads, found after the prefetch hook started them (this hook runs after it)."""

    def __init__(self):
        self.threads = None

    def after_create_session(self, session, coord):
        self.threads = latest_prefetch_threads(session.graph)

    def totals(self) -> tuple[int, float]:
        found = self.threads.executor_builds() if self.threads is not None else []
        return sum(b.builds for b in found), sum(b.cpu_seconds for b in found)


def run_once(model: str, run: str, data_dir: str, args: argparse.Namespace) -> dict:
    """One script run: per session (train, eval) its wall and CPU seconds and its producer's builds."""
    names = load_zoo(model)
    globals_ = names["main"].__globals__
    got: dict = {}

    def timed(session: str):
        call = globals_[session]

        def wrapper(config, hooks, *rest):
            builds = _Builds()
            wall, cpu = time.perf_counter(), time.process_time()
            call(config, [*hooks, builds], *rest)
            got[session] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
            got[session]["builds"], got[session]["build_cpu"] = builds.totals()
        return wrapper

    for session in SESSIONS:
        globals_[session] = timed(session)
    with tempfile.TemporaryDirectory() as ckpt:
        argv = ["--data_location", data_dir, "--checkpoint", ckpt, "--optimizer", "adam", "--parquet_dataset",
                "False", "--batch_size", str(args.batch_size), "--steps", str(args.steps),
                "--stage_threads", str(args.stage_threads), *RUNS[run]]
        graph = tf.Graph()
        with graph.as_default():
            globals_["args"] = names["get_arg_parser"]().parse_args(argv)
            names["main"]()
        results = names["RESULTS"]
        got["values"] = ([float(x) for x in results["losses"]], float(results["acc"]), float(results["auc"]))
        got["ops"] = len(graph.get_operations())
    return got


RESULT_MARK = "SECOND_SESSION_RUN "


def run_child(run: str, data_dir: str, args: argparse.Namespace) -> dict:
    """run_once in a new process (the same arguments); its result read back from the marked line."""
    argv = [sys.executable, "-m", "benchmarks.second_session", "--child", run, "--data-dir", data_dir,
            "--model", args.model, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
            "--stage-threads", str(args.stage_threads)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.run_timeout,
                          cwd=Path(__file__).resolve().parent.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"run {run} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def prepare(out: Path, rows: int, eval_rows: int) -> str:
    where = out / "data" / f"second-session-{rows}-{eval_rows}"
    if not (where / "eval.csv").exists():
        where.mkdir(parents=True, exist_ok=True)
        write_criteo_csv(where / "train.csv", rows, seed=1)
        write_criteo_csv(where / "eval.csv", eval_rows, seed=2)
    return str(where)


MODES = {"full": dict(model="wide_and_deep", repeats=5, rows=2000, eval_rows=1024, steps=20, batch_size=64),
         "quick": dict(model="wide_and_deep", repeats=3, rows=2000, eval_rows=1024, steps=20, batch_size=64),
         "smoke": dict(model="wide_and_deep", repeats=1, rows=128, eval_rows=64, steps=4, batch_size=32)}


def _table(model: str, measured: dict, ratios: dict) -> str:
    rows = []
    for run in RUNS:
        cells = [model, run]
        for session in ("eval", "train"):
            cells += [Spread.of(measured[run][session][m]).text(0 if m == "builds" else 2) for m in MEASURES]
        rows.append(cells)
    cells = [model, "on / off"]
    for session in ("eval", "train"):
        cells += [Spread.of(ratios[session][m]).text(2) if m in ("wall", "cpu", "build_cpu") else "" for m in MEASURES]
    rows.append(cells)
    header = ["script", "run"] + [f"{s} {h}" for s in ("eval", "train")
                                  for h in ("wall (s)", "CPU (s)", "builds", "build CPU (s)")]
    return markdown_table(header, rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.second_session", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    for flag, kind in (("--model", str), ("--repeats", int), ("--rows", int), ("--eval-rows", int), ("--steps", int),
                       ("--batch-size", int)):
        parser.add_argument(flag, type=kind)
    parser.add_argument("--stage-threads", type=int, default=4, help="staged(num_threads=): the model zoo's 4")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--publish", action="store_true", help="also copy the table to docs/perf/second_session.md")
    parser.add_argument("--run-timeout", type=int, default=600, help="seconds one run may take")
    parser.add_argument("--child", choices=list(RUNS), help=argparse.SUPPRESS)  # one run, in this process
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    if args.child:
        print(RESULT_MARK + json.dumps(run_once(args.model, args.child, args.data_dir, args)), flush=True)
        return 0
    started, machine = time.perf_counter(), machine_info()
    data_dir = prepare(args.out, args.rows, args.eval_rows)
    measured = {run: {s: {m: [] for m in MEASURES} for s in SESSIONS} for run in RUNS}
    ratios = {s: {m: [] for m in MEASURES} for s in SESSIONS}
    identical, ops, errors = [], {}, []
    for repeat in range(args.repeats):
        order = list(RUNS) if repeat % 2 == 0 else list(RUNS)[::-1]
        got = {}
        for run in order:
            try:
                got[run] = run_child(run, data_dir, args)
            except Exception as error:  # noqa: BLE001  one failing run must not end the benchmark
                errors.append(f"repeat {repeat + 1} {run}: {type(error).__name__}: {error}")
                continue
            ops[run] = got[run]["ops"]
            for session in SESSIONS:
                for m in MEASURES:
                    measured[run][session][m].append(got[run][session][m])
            e, t = got[run]["eval"], got[run]["train"]
            print(f"  repeat {repeat + 1} {run:3} eval {e['wall']:5.2f} s wall, {e['cpu']:5.2f} s CPU, {e['builds']} "
                  f"builds ({e['build_cpu']:.2f} s); train {t['wall']:5.2f} s, {t['cpu']:5.2f} s CPU, {t['builds']} "
                  f"builds ({t['build_cpu']:.2f} s)", file=sys.stderr)
        if len(got) == len(RUNS):
            identical.append(got["on"]["values"] == got["off"]["values"])
            for session in SESSIONS:
                for m in ("wall", "cpu", "build_cpu"):
                    off = got["off"][session][m]
                    ratios[session][m].append(got["on"][session][m] / off if off else float("nan"))
    command = "python -m benchmarks.second_session " + " ".join(argv if argv is not None else sys.argv[1:])
    seconds = time.perf_counter() - started
    same = "identical" if identical and all(identical) else "NOT identical" if identical else "not compared"
    text = "\n".join([
        f"Measured by `{command.strip()}` in {seconds:.0f} s on {machine_line(machine)} ({machine['date']}); "
        f"{args.model}, staged(num_threads={args.stage_threads}), batch {args.batch_size}, {args.steps} training "
        f"steps ({args.rows} rows), evaluation of {args.eval_rows} rows in a second session; {args.repeats} "
        "interleaved repeats, median (range); ratios on / off within each repeat.", "",
        _table(args.model, measured, ratios), "",
        f"Graph ops: off {ops.get('off', '-')}, on {ops.get('on', '-')}. Builds: the executors the stage's producer "
        "built in the session (build CPU: the callables'); the step's, restore's and control runs' builds are in "
        f"the session's CPU. Losses, accuracy and AUC flag on vs off: {same} in every repeat.", "",
        *[f"ERROR: {e}" for e in errors]]) + "\n"
    result = {"benchmark": "second_session", "command": command, "machine": machine,
              "parameters": vars(args) | {"out": str(args.out)}, "measured": measured, "ratios": ratios,
              "identical": identical, "ops": ops, "errors": errors, "seconds": round(seconds, 1)}
    paths = write_outputs(args.out, "second_session", result, None, publish=args.publish, text=text)
    print(text, end="")
    print(f"Wrote: {', '.join(str(p) for p in paths)}")
    return 1 if errors or (identical and not all(identical)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
