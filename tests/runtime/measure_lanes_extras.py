"""Measures what the prefetch pool and its trial (use_stage_subgraph_thread_pool=AUTOTUNE) buy on the inputs
that stay on lanes, against no pool and against always the pool.

Not a test (pytest does not collect it). Run from the repository root:

    python tests/runtime/measure_lanes_extras.py --repeats 3

Inputs that stay on lanes (tf.data cannot hold them, or the fold refuses them):

    random:  range -> iterator -> GetNext -> + random_uniform -> as_string -> hash -> one_hot -> tanh(matmul)
             -> staged() ~~ take -> matmuls(w) -> train            (a random op on the prefetch side)
    queue:   FIFOQueue filled by a QueueRunner -> dequeue_many -> the same body -> staged() ~~ ... -> train

Every configuration runs in its own process, interleaved with the others each repeat: an ss.Session with the
stage's defaults (num_threads and capacity AUTOTUNE) trains until the stage's tuner settles (bounded), then
`--steps` steps are timed. Printed per configuration: the median steps/s, each run's, and what the tuner chose.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BATCH, WIDTH = 256, 256
CONFIGS = {  # staged()'s pool arguments
    "trial": dict(),                                        # the defaults: the tuner tries the prefetch pool
    "shared": dict(use_stage_subgraph_thread_pool=False),   # no pool, no trial
    "own": dict(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1),  # always the pool
}


def _one(kind: str, config: str, steps: int, settle_seconds: float) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    import tensorflow as tf

    import smartstage as ss

    pool = CONFIGS[config]
    graph = tf.Graph()
    with graph.as_default():
        if kind == "random":
            iterator = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10**9).batch(BATCH))
            ids = tf.reshape(iterator.get_next(), [BATCH, 1]) + tf.random.uniform([BATCH, 32], maxval=10**6,
                                                                                   dtype=tf.int64)
        else:
            queue = tf.queue.FIFOQueue(1024, [tf.int64], shapes=[[32]])
            rows = tf.random.uniform([BATCH, 32], maxval=10**6, dtype=tf.int64)
            tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [queue.enqueue_many(rows)]))
            ids = queue.dequeue_many(BATCH)
        hashed = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), WIDTH)
        dense = tf.reduce_sum(tf.one_hot(hashed, WIDTH), axis=1)
        for i in range(3):
            dense = tf.tanh(tf.matmul(dense, tf.constant(0.01, shape=[WIDTH, WIDTH]) * (i + 1)))
        features = ss.staged(dense, **pool)
        h = features
        for i in range(4):
            w = tf.compat.v1.get_variable(f"w{i}", [WIDTH, WIDTH],
                                          initializer=tf.compat.v1.glorot_uniform_initializer())
            h = tf.nn.relu(tf.matmul(h, w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(tf.reduce_mean(h))
        init = tf.compat.v1.global_variables_initializer()
        with ss.Session(graph=graph) as sess:
            sess.run(init)
            coord = tf.train.Coordinator()
            runners = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
            sess.run(train)
            threads = sess.prefetch_threads
            start = time.monotonic()
            while not all(d.settled for d in threads.decisions()) and time.monotonic() - start < settle_seconds:
                sess.run(train)
            settle = time.monotonic() - start
            begin = time.perf_counter()
            for _ in range(steps):
                sess.run(train)
            rate = steps / (time.perf_counter() - begin)
            (decision,) = threads.decisions()
            coord.request_stop()
            sess.run(queue.close(cancel_pending_enqueues=True)) if kind == "queue" else None
            coord.join(runners, stop_grace_period_secs=5)
    return {"rate": rate, "settle_s": round(settle, 1), "lanes": decision.num_threads,
            "capacity": decision.capacity, "own_pool": decision.own_pool, "settled": decision.settled}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--settle-seconds", type=float, default=30.0)
    parser.add_argument("--kinds", default="random,queue")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--one", nargs=2, metavar=("KIND", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(*args.one, args.steps, args.settle_seconds)))
        return
    kinds, configs = args.kinds.split(","), args.configs.split(",")
    results: dict[tuple[str, str], list[dict]] = {(k, c): [] for k in kinds for c in configs}
    for _ in range(args.repeats):  # interleaved: machine noise spreads over every configuration
        for kind in kinds:
            for config in configs:
                done = subprocess.run([sys.executable, __file__, "--one", kind, config, "--steps", str(args.steps),
                                       "--settle-seconds", str(args.settle_seconds)],
                                      capture_output=True, text=True, cwd=ROOT, timeout=600)
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-2000:])
                results[(kind, config)].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"cores={os.cpu_count()} steps={args.steps} repeats={args.repeats}")
    for kind in kinds:
        base = statistics.median(r["rate"] for r in results[(kind, "shared")]) if "shared" in configs else None
        for config in configs:
            runs = results[(kind, config)]
            median = statistics.median(r["rate"] for r in runs)
            ratio = f" {median / base:4.2f}x shared" if base else ""
            chosen = [(r["lanes"], r["capacity"], "own" if r["own_pool"] else "shared", r["settle_s"]) for r in runs]
            print(f"{kind:6s} {config:6s} {median:7.1f} steps/s{ratio}  runs={[round(r['rate'], 1) for r in runs]}"
                  f"  (lanes, capacity, pool, settle s)={chosen}")


if __name__ == "__main__":
    main()
