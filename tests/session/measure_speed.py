"""Steps per second of the DLRM-like script with and without the flag (a measurement, not a test).

    python -m tests.session.measure_speed                      # benchmark sizes, batch 512, 3 rounds
    python -m tests.session.measure_speed --steps 50 --batch 256 --rounds 1 --pool

Each round builds the script's graph twice (flag off, flag on), trains through
ss.MonitoredTrainingSession with the prefetch hook, skips `--warmup` steps and times `--steps`.
`--pool` gives the prefetch runs their own inter-op pool (stage_subgraph_thread_pool_id=1, and
the ConfigProto lists two pools). Prints each run and the median ratio on / off.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import smartstage as ss  # noqa: E402
from smartstage.examples.data import prepare_criteo  # noqa: E402
from smartstage.examples.dlrm import build_dlrm  # noqa: E402
from smartstage.examples.options import DLRMOptions, InputOptions  # noqa: E402


def steps_per_second(files, on: bool, args) -> float:
    with tf.Graph().as_default():
        stage = functools.partial(ss.staged, num_threads=1, capacity=args.capacity,
                                  use_stage_subgraph_thread_pool=args.pool, stage_subgraph_thread_pool_id=1)
        model = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=stage,
                           options=DLRMOptions.benchmark(), input_options=InputOptions(batch_size=args.batch))
        config = ss.ConfigProto()
        config.graph_options.optimizer_options.do_smart_stage = on
        if args.pool:
            config.session_inter_op_thread_pool.add(num_threads=0)
            config.session_inter_op_thread_pool.add(num_threads=1)
        with ss.MonitoredTrainingSession(config=config, hooks=[ss.make_prefetch_hook()], save_checkpoint_secs=None,
                                         save_summaries_steps=None, log_step_count_steps=None) as sess:
            for _ in range(args.warmup):
                sess.run(model.train_op)
            start = time.perf_counter()
            for _ in range(args.steps):
                sess.run(model.train_op)
            return args.steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--capacity", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--pool", action="store_true")
    args = parser.parse_args()
    files = prepare_criteo(tempfile.mkdtemp(prefix="measure_speed_"), num_rows=args.rows, seed=0)
    ratios = []
    for round_index in range(args.rounds):
        off = steps_per_second(files, False, args)
        on = steps_per_second(files, True, args)
        ratios.append(on / off)
        print(f"round {round_index}: flag off {off:7.2f} steps/s, flag on {on:7.2f} steps/s, on/off {on / off:.3f}",
              flush=True)
    print(f"median on/off over {args.rounds} round(s): {statistics.median(ratios):.3f} "
          f"(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
