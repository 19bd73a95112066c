"""Measures whether prefetch runs on their own inter-op thread pool help the training step.

Not a test (pytest does not collect it): a quick measurement behind the default documented in
docs/runtime.md. Run from the repository root:

    python tests/runtime/measure_thread_pool.py --steps 300 --repeats 3

Graph: a CPU-heavy prefetch side (hashing strings, a dense transform) behind a stage, and a
main side that trains a small dense model on it:

    random ids -> as_string -> hash -> one_hot/dense -> tanh chain -> put ~~ take -> matmuls(w) -> train

Each configuration runs `--steps` training steps after a warm-up and reports steps/sec (median
of `--repeats` runs); "inline" runs the same computation without a stage.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import config_pb2  # noqa: E402

import smartstage.runtime as ss  # noqa: E402

tf.compat.v1.disable_eager_execution()

BATCH, WIDTH = 256, 256


def _slow_read(latency_ms: float):
    def read(seed):
        time.sleep(latency_ms / 1000.0)   # storage latency: a synchronous op holding its thread
        return seed
    return read


def _prefetch_side(prep_layers: int, latency_ms: float) -> tf.Tensor:
    ids = tf.random.uniform([BATCH, 32], maxval=10**6, dtype=tf.int64)
    if latency_ms > 0:
        ids = tf.reshape(tf.compat.v1.numpy_function(_slow_read(latency_ms), [ids], tf.int64), [BATCH, 32])
    hashed = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), WIDTH)
    dense = tf.reduce_sum(tf.one_hot(hashed, WIDTH), axis=1)
    for _ in range(prep_layers):
        dense = tf.tanh(tf.matmul(dense, tf.random.normal([WIDTH, WIDTH])) * 0.01)
    return dense


def _main_side(features: tf.Tensor, train_layers: int) -> tf.Operation:
    h = features
    for i in range(train_layers):
        w = tf.compat.v1.get_variable(f"w{i}", [WIDTH, WIDTH], initializer=tf.compat.v1.glorot_uniform_initializer())
        h = tf.nn.relu(tf.matmul(h, w))
    loss = tf.reduce_mean(h)
    return tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)


def _config(pools: bool, inter_op: int, stage_pool_threads: int) -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op)
    if pools:
        config.session_inter_op_thread_pool.extend([
            config_pb2.ThreadPoolOptionProto(num_threads=inter_op),
            config_pb2.ThreadPoolOptionProto(num_threads=stage_pool_threads),
        ])
    return config


def run(mode: str, num_threads: int, capacity: int, steps: int, prep_layers: int, train_layers: int,
        inter_op: int, latency_ms: float, stage_pool_threads: int) -> float:
    graph = tf.Graph()
    with graph.as_default():
        features = _prefetch_side(prep_layers, latency_ms)
        if mode != "inline":
            features = ss.staged(features, capacity=capacity, num_threads=num_threads,
                                 use_stage_subgraph_thread_pool=(mode == "own_pool"),
                                 stage_subgraph_thread_pool_id=1 if mode == "own_pool" else 0)
        train = _main_side(features, train_layers)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph, config=_config(mode == "own_pool", inter_op, stage_pool_threads)) as sess:
        sess.run(init)
        threads = ss.start_prefetch_threads(sess) if mode != "inline" else None
        for _ in range(20):
            sess.run(train)
        start = time.perf_counter()
        for _ in range(steps):
            sess.run(train)
        elapsed = time.perf_counter() - start
        if threads is not None:
            threads.stop()
    return steps / elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prep-layers", type=int, default=3)
    parser.add_argument("--train-layers", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="a synchronous read on the prefetch side sleeps this long per batch")
    parser.add_argument("--stage-pool-threads", type=int, default=1,
                        help="threads of the stage's own pool (pool 1) in the own_pool runs")
    parser.add_argument("--inter-op", type=int, default=0, help="inter-op threads (0: one per core)")
    args = parser.parse_args(argv)
    print(f"cores={os.cpu_count()} steps={args.steps} repeats={args.repeats} "
          f"prep_layers={args.prep_layers} train_layers={args.train_layers} inter_op={args.inter_op} "
          f"latency_ms={args.latency_ms} stage_pool_threads={args.stage_pool_threads}")
    configs = [("inline", 1, 1)] + [
        (mode, threads, capacity)
        for mode in ("shared_pool", "own_pool")
        for threads, capacity in ((1, 2), (2, 4), (4, 8))
    ]
    results = {config: [] for config in configs}
    for _ in range(args.repeats):   # interleaved, so machine noise spreads over all configurations
        for config in configs:
            mode, threads, capacity = config
            results[config].append(run(mode, threads, capacity, args.steps, args.prep_layers,
                                       args.train_layers, args.inter_op, args.latency_ms, args.stage_pool_threads))
    base = statistics.median(results[configs[0]])
    for (mode, threads, capacity), values in results.items():
        median = statistics.median(values)
        print(f"{mode:12s} threads={threads} capacity={capacity}: {median:7.1f} steps/s "
              f"({median / base:4.2f}x inline)  runs={[round(v, 1) for v in values]}")


if __name__ == "__main__":
    main()
