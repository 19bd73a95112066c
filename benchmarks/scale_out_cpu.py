"""Scale-out where it pays: a CPU-bound input side, the trainer confined to core 0, input tasks on core 1.

    python -m benchmarks.scale_out --cpu-bound [--repeats 5 --steps 60 --work 40]

Run from benchmarks/scale_out.py; the job's graph and the loopback servers are in benchmarks/scale_out_job.py. The trainer
process pins itself to core 0 before TensorFlow starts a thread, each input-task process to core 1
(threads inherit a process's affinity), so AUTOTUNE's local lanes share the trainer's one core while an
input task brings a core of its own. Measured, interleaved in every repeat: steps/s and the trainer
process's and the input-task processes' CPU per step of each configuration (/proc/<pid>/stat), and the
preprocessing's CPU per batch alone. From those, benchmarks/scale_out_model.py predicts the measured
configurations (the check) and larger clusters.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.scale_out_job import BATCH, OUT, REPO, ROWS, free_ports, heavy, job_graph, measure
from benchmarks.scale_out_model import ClusterModel, model_text

TRAINER_CORE, TASK_CORE = 0, 1
# (lanes, tasks, lanes per task): one lane carries one batch at a time through the trainer's head, the round
# trip and the task's body, so a second lane per task overlaps that latency with the task's CPU
CONFIGS = {"trainer, AUTOTUNE": (0, 0, 1), "input tasks 1": (1, 1, 1), "input tasks 1, 3 lanes": (3, 1, 3),
           "input tasks 2": (2, 2, 1)}


def _input_cpu_per_batch(work: int, batches: int = 40) -> float:
    """CPU seconds per batch of the prefetch side alone (read + preprocessing, no stage), on this process's core."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        ds = tf.data.Dataset.range(ROWS).map(lambda i: tf.cast(tf.stack([i % 97, i % 13, i % 7, i % 5]), tf.float32))
        x = tf.compat.v1.data.make_one_shot_iterator(ds.batch(BATCH)).get_next()
        x = heavy(tf.math.log1p(tf.abs(x)) * 2.0 + tf.sqrt(tf.abs(x) + 1.0), work)
        with tf.compat.v1.Session(graph=graph) as sess:
            for _ in range(5):
                sess.run(x)
            used = time.process_time()
            for _ in range(batches):
                sess.run(x)
            return (time.process_time() - used) / batches


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used: /proc/<pid>/stat fields 14 and 15."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cpu_bound(args) -> int:
    os.sched_setaffinity(0, {TRAINER_CORE})  # before TensorFlow's thread pools exist
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    cores = len(os.sched_getaffinity(0))
    ports = free_ports(3)
    spec = {"trainer": [f"127.0.0.1:{ports[0]}"], "input": [f"127.0.0.1:{p}" for p in ports[1:]]}
    lifetime = 120 + args.repeats * 60
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    servers = [subprocess.Popen([sys.executable, "-m", "benchmarks.scale_out", "--serve", "input", str(i),
                                 json.dumps(spec), str(lifetime), str(TASK_CORE)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    samples = {name: [] for name in CONFIGS}
    cpu = {name: [] for name in CONFIGS}
    task_cpu = {name: [] for name in CONFIGS}
    tasks_used = lambda: sum(_process_cpu(p.pid) for p in servers)  # noqa: E731
    input_cpu: list[float] = []
    started = time.perf_counter()
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="trainer", task_index=0)
        graphs = {name: job_graph(0, lanes, tasks, args.work, args.train_work, per_task)
                  for name, (lanes, tasks, per_task) in CONFIGS.items()}
        for repeat in range(args.repeats):
            input_cpu.append(_input_cpu_per_batch(args.work))
            for name, (meta, init, train) in graphs.items():
                samples[name].append(measure(meta, init, train, server.target, args.steps, args.warmup, cpu[name],
                                              tasks_used, task_cpu[name]))
            print(f"repeat {repeat + 1}/{args.repeats}: input side alone {1000 * input_cpu[-1]:.1f} ms CPU a batch; "
                  + ", ".join(f"{n} {s[-1]:.1f} steps/s ({1000 * cpu[n][-1]:.1f} ms CPU a step)"
                              for n, s in samples.items()), file=sys.stderr, flush=True)
    finally:
        for process in servers:
            process.kill()
            process.wait(timeout=10)
    median = {name: statistics.median(v) for name, v in samples.items()}
    model = ClusterModel(c_in=statistics.median(input_cpu), local_cpu=statistics.median(cpu["trainer, AUTOTUNE"]),
                         trainer_cpu=statistics.median(cpu["input tasks 1"]),
                         task_cpu=statistics.median(task_cpu["input tasks 1"]),
                         lane_seconds=1.0 / median["input tasks 1"],
                         boundary_bytes=4 * 4 * 64)  # [batch 64, 4] float32
    base = median["trainer, AUTOTUNE"]
    lines = [f"CPU-bound scale-out ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `python -m benchmarks.scale_out --cpu-bound --repeats {args.repeats} --steps "
             f"{args.steps} --work {args.work} --train-work {args.train_work}`), {time.perf_counter() - started:.0f} s, load average "
             f"{tuple(round(x, 2) for x in os.getloadavg())} at end; trainer on core {TRAINER_CORE} ({cores} core), "
             f"input tasks on core {TASK_CORE}; {args.repeats} interleaved repeats, median [min, max]:", "",
             "| configuration | steps/s | x trainer, AUTOTUNE | CPU ms a step: trainer | input tasks | model predicts |",
             "|---|---|---|---|---|---|"]
    # the check: the model with this machine's cores (the trainer 1, the tasks 1 between them); "input tasks 1"
    # fitted lane_seconds, so its prediction is the measurement where the lane binds
    predicted = {"trainer, AUTOTUNE": model.local_rate(1), "input tasks 1": model.tasks_rate(1, 1, 1),
                 "input tasks 1, 3 lanes": model.tasks_rate(1, 1, 1, lanes_per_task=3),
                 "input tasks 2": model.tasks_rate(1, 2, 0.5)}
    for name, values in samples.items():
        lines.append(f"| {name} | {median[name]:.1f} [{min(values):.1f}, {max(values):.1f}] | "
                     f"{median[name] / base:.2f}x | {1000 * statistics.median(cpu[name]):.1f} | "
                     f"{1000 * statistics.median(task_cpu[name]):.1f} | "
                     f"{predicted[name]:.1f} |")
    lines += ["", model_text(model)]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scale_out-cpu-latest.json").write_text(json.dumps(
        {"args": vars(args), "samples": samples, "trainer_cpu_per_step": cpu, "task_cpu_per_step": task_cpu,
         "input_cpu_per_batch": input_cpu,
         "model": model.as_dict(), "predicted": predicted}, indent=2))
    (OUT / "scale_out-cpu-latest.md").write_text(text)
    if args.publish:
        (REPO / "docs" / "perf" / "scale_out-cpu.md").write_text(text)
    os._exit(0)  # the trainer's server has no shutdown
