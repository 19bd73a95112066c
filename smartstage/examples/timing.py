"""Steps per second of every example model in a plain loop (no stage), and of its input side alone.

    python -m smartstage.examples.timing                       # small sizes (what the tests use)
    python -m smartstage.examples.timing --benchmark-sizes     # the benchmark variants, batch 512

The "input side" is reading, parsing and preprocessing alone (the `preprocessed` tensors, no model):
its rate against the full step's says how much a stage could hide. A sanity check for the examples,
not the project's benchmark (see benchmarks/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Callable, Optional, Sequence

import tensorflow as tf

from smartstage.examples.data import CriteoFiles, prepare_criteo
from smartstage.examples.demo import build_demo
from smartstage.examples.dlrm import build_dlrm
from smartstage.examples.options import DLRMOptions, InputOptions, ModelGraph, WideDeepOptions
from smartstage.examples.running import steps_per_second
from smartstage.examples.wide_deep import build_wide_deep


def _cases(files: CriteoFiles, benchmark_sizes: bool, batch_size: int) -> list[tuple[str, Callable[[], ModelGraph]]]:
    dlrm = DLRMOptions.benchmark() if benchmark_sizes else DLRMOptions()
    wide_deep = WideDeepOptions.benchmark() if benchmark_sizes else WideDeepOptions()
    def dlrm_with(io: InputOptions) -> Callable[[], ModelGraph]:
        return lambda: build_dlrm(files.data_path, files.vocabulary_paths, options=dlrm, input_options=io)

    def wide_deep_with(io: InputOptions) -> Callable[[], ModelGraph]:
        return lambda: build_wide_deep(files.data_path, files.vocabulary_paths, options=wide_deep, input_options=io)

    queue = InputOptions(reader="queue", batch_size=batch_size)
    dataset = InputOptions(reader="dataset", batch_size=batch_size)
    return [
        ("dlrm/queue", dlrm_with(queue)),
        ("dlrm/dataset", dlrm_with(dataset)),
        ("dlrm/dataset+prefetch", dlrm_with(replace(dataset, prefetch=-1))),
        ("dlrm/dataset+5ms", dlrm_with(replace(dataset, read_latency_ms=5.0))),
        ("wide_deep/queue", wide_deep_with(queue)),
        ("wide_deep/dataset", wide_deep_with(dataset)),
        ("demo", lambda: build_demo(files.data_path, batch_size=batch_size)),
    ]


def measure(build: Callable[[], ModelGraph], steps: int, repeats: int = 1) -> tuple[float, float, float, int]:
    """(build seconds, train steps/sec, input-side batches/sec, graph nodes) of one example.

    The rates are medians over `repeats` sessions, alternating train and input side.
    """
    graph = tf.Graph()
    with graph.as_default():
        start = time.perf_counter()
        model = build()
        built = time.perf_counter() - start
        input_side = tf.group(*model.preprocessed.values(), name="input_side")
    train, read = [], []
    for _ in range(repeats):
        train.append(steps_per_second(graph, model.train_op, steps, init_op=model.init_op))
        read.append(steps_per_second(graph, input_side, steps, init_op=model.init_op))
    return built, statistics.median(train), statistics.median(read), len(graph.as_graph_def().node)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Prints one row per model: build time, train steps/sec, input-side batches/sec, nodes."""
    parser = argparse.ArgumentParser(prog="python -m smartstage.examples.timing", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="generated rows (default 20000)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per model (default 200)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32, or 512 with --benchmark-sizes")
    parser.add_argument("--benchmark-sizes", action="store_true", help="DLRMOptions/WideDeepOptions.benchmark()")
    parser.add_argument("--repeats", type=int, default=1, help="sessions per model; rates are medians")
    parser.add_argument("--only", default="", help="run only the models whose name contains this")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    batch_size = args.batch_size or (512 if args.benchmark_sizes else 32)
    with tempfile.TemporaryDirectory() as tmp:
        files = prepare_criteo(tmp, args.rows)
        print(f"{'model':24} {'build s':>8} {'train steps/s':>14} {'input batches/s':>16} {'nodes':>7}")
        for name, build in _cases(files, args.benchmark_sizes, batch_size):
            if args.only in name:
                built, train, read, nodes = measure(build, args.steps, args.repeats)
                print(f"{name:24} {built:8.2f} {train:14.1f} {read:16.1f} {nodes:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
