"""Scale-out: steps/s of an input-bound job with its prefetch side on 1, 2, 4 input tasks (loopback).

    python -m benchmarks.scale_out                      # 5 interleaved repeats, 40 ms per batch
    python -m benchmarks.scale_out --repeats 7 --read-millis 40 --steps 60

The job: a tf.data source on the trainer, a per-batch read that waits `--read-millis` without using
CPU (a dataset of the batch that sleeps, reduced to one element: storage latency), light stateless
preprocessing, then a small training step. Each input task is a tf.distribute.Server in its own
process on 127.0.0.1. Configurations, measured in turn in every repeat (interleaved):

    trainer x1      everything on the trainer, one prefetch lane (the stage's defaults before scale-out)
    trainer x4      everything on the trainer, four ordered lanes (what more lanes give on one host)
    input tasks N   input_job="input", central mode, one lane per task, N = 1, 2, 4

Prints medians with [min, max] and the speed-up over "trainer x1"; writes
benchmarks/out/scale_out-latest.json.

    python -m benchmarks.scale_out --cpu-bound          # the trainer's cores are the bound

The CPU-bound case: no storage wait; the stateless preprocessing computes --work rounds of elementwise
math on a [batch, 256] float tensor, and the training step --train-work dense layers of 512 (each side
several ms of CPU a batch: a trainer's host that both preprocesses and trains). The trainer process is confined to core
0 (os.sched_setaffinity, set before TensorFlow starts its threads) and every input-task process to core 1,
so input tasks add the CPU the trainer does not have. Configurations, interleaved in every repeat:

    trainer, AUTOTUNE   everything on the trainer's core, staged()'s defaults (AUTOTUNE's local lanes)
    input tasks N       input_job="input", central mode, N = 1, 2 (both tasks share core 1: 2 cores
                        show one extra core, not how N tasks on N hosts scale), and 1 task with 3 lanes
                        (a lane carries one batch at a time: more lanes overlap its round trip)

Beside the steps/s, each configuration's trainer-process CPU per step, and the preprocessing's CPU per
batch alone, feed a model of larger clusters (benchmarks/scale_out_model.py) that is checked against the
rates of the same run. Writes benchmarks/out/scale_out-cpu-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.scale_out_cpu import run_cpu_bound
from benchmarks.scale_out_job import OUT, REPO, free_ports, job_graph, measure, serve


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        serve(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--read-millis", type=int, default=40)
    parser.add_argument("--publish", action="store_true", help="also write the table to docs/perf/scale_out*.md")
    parser.add_argument("--cpu-bound", action="store_true", help="the CPU-bound case: trainer on core 0, input "
                                                                 "tasks on core 1, no storage wait")
    parser.add_argument("--work", type=int, default=200, help="--cpu-bound: rounds of elementwise math a batch")
    parser.add_argument("--train-work", type=int, default=6, help="--cpu-bound: dense layers of 512 in the step")
    args = parser.parse_args(argv)
    if args.cpu_bound:
        return run_cpu_bound(args)

    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    ports = free_ports(5)
    spec = {"trainer": [f"127.0.0.1:{ports[0]}"], "input": [f"127.0.0.1:{p}" for p in ports[1:]]}
    lifetime = 60 + args.repeats * 5 * (args.steps + args.warmup) * args.read_millis / 1000 * 3
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    servers = [subprocess.Popen([sys.executable, "-m", "benchmarks.scale_out", "--serve", "input", str(i),
                                 json.dumps(spec), str(lifetime)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(4)]
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="trainer", task_index=0)
        configs = {"trainer x1": (1, 0), "trainer x4": (4, 0), "input tasks 1": (1, 1), "input tasks 2": (2, 2),
                   "input tasks 4": (4, 4)}
        graphs = {name: job_graph(args.read_millis, lanes, tasks) for name, (lanes, tasks) in configs.items()}
        samples: dict[str, list[float]] = {name: [] for name in configs}
        for repeat in range(args.repeats):
            for name, (meta, init, train) in graphs.items():
                samples[name].append(measure(meta, init, train, server.target, args.steps, args.warmup))
            print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{n} {s[-1]:.1f}" for n, s in samples.items()),
                  file=sys.stderr, flush=True)
    finally:
        for process in servers:
            process.kill()
            process.wait(timeout=10)
    base = statistics.median(samples["trainer x1"])
    rows = []
    print(f"{'configuration':<16} {'steps/s median':>15} {'[min, max]':>16} {'vs trainer x1':>14}")
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append({"config": name, "median": median, "min": min(values), "max": max(values), "samples": values,
                     "speedup": median / base})
        print(f"{name:<16} {median:>15.1f} {f'[{min(values):.1f}, {max(values):.1f}]':>16} {median / base:>13.2f}x")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scale_out-latest.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    if args.publish:
        table = ["| configuration | steps/s | vs trainer x1 |", "|---|---|---|"] + [
            f"| {r['config']} | {r['median']:.1f} [{r['min']:.1f}, {r['max']:.1f}] | {r['speedup']:.2f}x |" for r in rows]
        (REPO / "docs" / "perf" / "scale_out.md").write_text(
            f"`python -m benchmarks.scale_out --repeats {args.repeats} --steps {args.steps} --read-millis "
            f"{args.read_millis}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
            f"{tuple(round(x, 2) for x in os.getloadavg())} at end; median [min, max]:\n\n" + "\n".join(table) + "\n")
    os._exit(0)  # the trainer's server has no shutdown


if __name__ == "__main__":
    sys.exit(main())
