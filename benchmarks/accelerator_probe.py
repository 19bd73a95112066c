"""Where a SmartStage step's time goes on the emulated accelerator: fixed settings beside AUTOTUNE, per batch.

    python -m benchmarks.accelerator_probe                         # DLRM-like, device 5 ms, 5 repeats (~2 min)
    python -m benchmarks.accelerator_probe --device-ms 2 --points auto,1s,2s,1o,2o
    python -m benchmarks.accelerator_probe --smoke                # a tiny model on 2,000 rows (the test)

The accelerator family (python -m benchmarks.e2e --accelerator) says how fast; this says why. One graph of
SmartStage's (staged() + the flag) and the bare step (benchmarks/sides.py), sessions at each point kept
open, every point timed once per repeat in a new shuffled order:

    auto   the defaults (ss.Session: AUTOTUNE lanes, capacity and pool)
    1s 2s  1 or 2 lanes on the shared inter-op pool (capacity AUTOTUNE)     3s ... likewise
    1o 2o  1 or 2 lanes on their own pool of as many threads                1s4: the step's pool 4 threads

Per point: steps/s and its ratio to the bare step within the repeat; the process's CPU a step; from traced
steps (RunOptions FULL_TRACE, every 5th step) how long the take waited for a batch and how long the device
op took; the lanes' wall per batch (head + body, PipelineStats) beside the step; and the input side alone
at the same setting (the take run in a loop, no step): its batches/s and CPU a batch. Writes
benchmarks/out/accelerator-probe-latest.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage as ss
from benchmarks.e2e import prepare_data
from benchmarks.report import DEFAULT_OUT, Spread, load_average, machine_info, markdown_table, write_outputs
from benchmarks.runners import (
    CONFIGS_BY_NAME,
    DEFAULT_SETTING,
    ConfigRunner,
    OpenRun,
    Setting,
    Workload,
    session_config,
    smart_split,
)
from benchmarks.sides import SidesRunner

TRACE = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
TRACE_EVERY = 5


def point_setting(token: str) -> Setting:
    """'auto' -> the defaults; '2s' -> 2 lanes, shared pool; '1o' -> 1 lane, own pool; '1s4' -> step pool of 4."""
    if token == "auto":
        return DEFAULT_SETTING
    if len(token) < 2 or not token[0].isdigit() or token[1] not in "so":
        raise ValueError(f"point {token!r}: use auto, or <lanes>s / <lanes>o [<inter-op threads>], e.g. 2s, 1o, 1s4")
    return Setting(threads=int(token[0]), capacity=ss.AUTOTUNE, own_pool=token[1] == "o", inter_op=int(token[2:] or 0))


def take_op(graph: tf.Graph, train_op: tf.Operation) -> tf.Operation:
    """The stage take the train op reads (the rewritten stage's, after SmartStage moved the cut)."""
    seen, todo = set(), [train_op]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "QueueDequeueV2" and op.name.endswith("take"):
            return op
        todo += [t.op for t in op.inputs] + list(op.control_inputs)
    raise LookupError(f"no stage take feeds {train_op.name}")


def traced_step(sess, fetch) -> tuple[float, float]:
    """One traced step: (ms the take waited for a batch, ms the device op took)."""
    metadata = config_pb2.RunMetadata()
    sess.run(fetch, options=TRACE, run_metadata=metadata)
    take = device = 0.0
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if node.node_name.endswith("/take"):
                take = max(take, node.all_end_rel_micros / 1000)
            elif node.node_name.endswith("emulated_device/wait"):
                device = max(device, node.all_end_rel_micros / 1000)
    return take, device


def block(run: OpenRun, take: tf.Operation, steps: int) -> dict:
    """One timed block of a point: the steps (every TRACE_EVERY-th traced), then the input side alone."""
    for _ in range(run.buffered() + 8):  # the head start the idle session buffered, and warm-up
        run.train()
    takes, devices = [], []
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        if i % TRACE_EVERY == TRACE_EVERY - 1:
            waited, device = traced_step(run.sess, run.runner.model.train_op)
            takes.append(waited)
            devices.append(device)
        else:
            run.train()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    threads = run.prefetch_threads()
    stats = threads.stats() if threads is not None else []
    lane_ms = sum(1000 * (s.head_seconds + s.body_seconds) for s in stats)
    lanes = tuple(s.num_threads for s in stats)
    pools = tuple(s.own_pool for s in stats)
    # the input side alone at the same setting: the step's take in a loop (nothing else runs)
    for _ in range(run.buffered()):
        run.sess.run(take)
    alone_wall, alone_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        run.sess.run(take)
    alone_wall, alone_cpu = time.perf_counter() - alone_wall, time.process_time() - alone_cpu
    return {"steps_per_sec": steps / wall, "cpu_ms": 1000 * cpu / steps, "take_ms": statistics.mean(takes),
            "device_ms": statistics.mean(devices), "lane_ms": lane_ms, "lanes": lanes, "own_pool": pools,
            "alone_per_sec": steps / alone_wall, "alone_cpu_ms": 1000 * alone_cpu / steps}


def bare_block(sides: SidesRunner, bare: tf.compat.v1.Session, steps: int) -> dict:
    """The sides of SmartStage's cut (benchmarks/sides.py), and traced steps of the bare step in its own session
    `bare`: the device op with no lane beside it."""
    measured = sides.sample(4, steps)["smart"]
    train = bare.graph.get_operation_by_name(sides.trains["smart"][2])
    devices = [traced_step(bare, train)[1] for _ in range(max(1, steps // TRACE_EVERY))]
    return {"sides": measured, "device_ms": statistics.mean(devices)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dlrm", choices=("dlrm", "wide_deep"))
    parser.add_argument("--device-ms", type=float, default=5.0)
    parser.add_argument("--points", default="auto,1s,2s,1o,2o", help="comma-separated points (auto, 1s, 2o, 1s4, ...)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="timed steps a block (and take-only runs)")
    parser.add_argument("--settle-seconds", type=float, default=30.0)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--size", default="benchmark", choices=("benchmark", "small"))
    parser.add_argument("--smoke", action="store_true", help="a tiny model on 2,000 rows, 1 repeat of 12 steps")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default benchmarks/out)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.rows, args.batch_size = "small", 2000, 32
        args.repeats, args.steps, args.settle_seconds = 1, 12, 5.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started = time.perf_counter()
    machine = machine_info()
    files = prepare_data(args.out, args.rows, 0)
    workload = Workload(args.model, "device", 0.0, args.batch_size, args.size, device_ms=args.device_ms)
    smart = ConfigRunner(CONFIGS_BY_NAME["smart_lanes"], workload, files)  # the points are lane settings
    sides = SidesRunner(ConfigRunner(CONFIGS_BY_NAME["no_stage"], workload, files), smart_split(smart))
    take = take_op(smart.graph, smart.model.train_op)
    points = args.points.split(",")
    opened = {p: smart.open(point_setting(p)) for p in points}
    settle = {p: run.settle(sys.maxsize, args.settle_seconds) for p, run in opened.items()}
    sides.open()
    bare_graph, bare_init, _ = sides.trains["smart"]
    bare_session = tf.compat.v1.Session(graph=bare_graph, config=session_config(DEFAULT_SETTING, workload))
    bare_session.run(bare_init)
    samples: dict[str, list] = {p: [] for p in points + ["sides"]}
    rng = random.Random(0)
    try:
        for repeat in range(args.repeats):
            order = points + ["sides"]
            rng.shuffle(order)
            for p in order:
                samples[p].append(bare_block(sides, bare_session, args.steps) if p == "sides"
                                  else block(opened[p], take, args.steps))
            print(f"repeat {repeat + 1}: " + ", ".join(f"{p} {samples[p][-1]['steps_per_sec']:.0f}" for p in points)
                  + f", bare {1 / samples['sides'][-1]['sides'].t_train:.0f} steps/s (load {load_average()})",
                  file=sys.stderr, flush=True)
    finally:
        for run in opened.values():
            run.close()
        sides.close()
        bare_session.close()
    measured = [s["sides"] for s in samples["sides"]]
    bare = [1 / s.t_train for s in measured]
    rows = []
    for p in points:
        got = samples[p]
        spread = lambda key: Spread.of(s[key] for s in got)  # noqa: E731
        rows.append([p, point_setting(p).label, spread("steps_per_sec").text(1),
                     Spread.of(s["steps_per_sec"] / b for s, b in zip(got, bare)).text(2),
                     spread("cpu_ms").text(1), spread("take_ms").text(2), spread("device_ms").text(2),
                     spread("lane_ms").text(1), spread("alone_per_sec").text(0), spread("alone_cpu_ms").text(1),
                     "; ".join(sorted({"/".join(f"{k} lane{'s' if k > 1 else ''}, {'own' if own else 'shared'} pool"
                                        for k, own in zip(s["lanes"], s["own_pool"])) for s in got}))])
    header = ["point", "setting", "steps/s", "of the bare step", "CPU ms a step", "take waited ms",
              "device op ms", "lanes' wall ms a batch", "input alone batches/s", "input alone CPU ms a batch",
              "chosen"]
    cpu_train = Spread.of(1000 * s.cpu_train for s in measured).text(2)
    sides_line = (f"The bare step {Spread.of(bare).text(1)} steps/s ({cpu_train} "
                  f"ms CPU; its device op {Spread.of(s['device_ms'] for s in samples['sides']).text(2)} ms, traced); "
                  f"the input side alone on one lane (SmartStage's cut) "
                  f"{Spread.of(1 / s.t_in for s in measured).text(0)} "
                  f"batches/s at {Spread.of(1000 * s.cpu_in for s in measured).text(1)} ms CPU a batch.")
    text = "\n".join([
        f"{workload.name}: SmartStage at fixed settings and AUTOTUNE, {args.repeats} interleaved repeats of "
        f"{args.steps} steps (every {TRACE_EVERY}th traced), median (range); load average "
        f"{machine.get('load_average_at_start')} at start, {load_average()} at end.", "",
        markdown_table(header, rows), "", sides_line, "",
        "AUTOTUNE settling: " + "; ".join(f"{p}: {s['decisions']} after {s['seconds']} s" for p, s in settle.items()
                                          if p == "auto"), ""])
    result = {"benchmark": "accelerator_probe", "command": "python -m benchmarks.accelerator_probe "
              + " ".join(argv if argv is not None else sys.argv[1:]), "machine": machine,
              "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "settle": settle, "samples": samples,
              "seconds": round(time.perf_counter() - started, 1)}
    write_outputs(args.out, "accelerator-probe", result, text=text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
