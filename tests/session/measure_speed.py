"""Steps per second of the DLRM-like script with and without the flag (a measurement, not a test).

    python -m tests.session.measure_speed                       # benchmark sizes, batch 512
    python -m tests.session.measure_speed --blocks 20 --block-steps 20 --pool

Builds the script's graph twice (flag off, flag on), opens both ss.MonitoredTrainingSessions with
the prefetch hook, warms both up, then alternates blocks of `--block-steps` steps between them and
sums the time per side: on a shared machine, load that drifts hits both sides alike. (The idle
session's prefetch thread waits on its full buffer and uses no CPU.) `--pool` gives the prefetch
runs their own inter-op pool (stage_subgraph_thread_pool_id=1; the ConfigProto lists two pools).
"""

from __future__ import annotations

import argparse
import contextlib
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


def open_session(stack: contextlib.ExitStack, files, on: bool, args):
    graph = tf.Graph()
    with graph.as_default():
        stage = functools.partial(ss.staged, num_threads=1, capacity=args.capacity,
                                  use_stage_subgraph_thread_pool=args.pool, stage_subgraph_thread_pool_id=1)
        model = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=stage,
                           options=DLRMOptions.benchmark(), input_options=InputOptions(batch_size=args.batch))
        config = ss.ConfigProto()
        config.graph_options.optimizer_options.do_smart_stage = on
        if args.pool:
            config.session_inter_op_thread_pool.add(num_threads=0)
            config.session_inter_op_thread_pool.add(num_threads=1)
        sess = stack.enter_context(ss.MonitoredTrainingSession(
            config=config, hooks=[ss.make_prefetch_hook()], save_checkpoint_secs=None,
            save_summaries_steps=None, log_step_count_steps=None))
    for _ in range(args.warmup):
        sess.run(model.train_op)
    return sess, model.train_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--capacity", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--pool", action="store_true")
    args = parser.parse_args()
    files = prepare_criteo(tempfile.mkdtemp(prefix="measure_speed_"), num_rows=args.rows, seed=0)
    seconds = {False: [], True: []}
    with contextlib.ExitStack() as stack:
        sessions = {on: open_session(stack, files, on, args) for on in (False, True)}
        for block in range(args.blocks):
            for on in ((False, True) if block % 2 == 0 else (True, False)):
                sess, train_op = sessions[on]
                start = time.perf_counter()
                for _ in range(args.block_steps):
                    sess.run(train_op)
                seconds[on].append(time.perf_counter() - start)
    steps = args.blocks * args.block_steps
    off, on = steps / sum(seconds[False]), steps / sum(seconds[True])
    ratios = [a / b for a, b in zip(seconds[False], seconds[True])]
    print(f"flag off {off:.2f} steps/s, flag on {on:.2f} steps/s, on/off {on / off:.3f} "
          f"(per-block ratios: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}; "
          f"{args.blocks} blocks of {args.block_steps} steps, batch {args.batch}, pool={args.pool}, "
          f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
