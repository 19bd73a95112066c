"""The trainer of the loopback test cluster, in its own process: optimizes, trains, prints one JSON line.

    python -m tests.cluster.trainer <cluster json> <mode> <tasks> <run dir> [--kill-after STEPS]

It builds tests/cluster/graphs.py, runs it unoptimized in a local session (the reference), optimizes it
with input_job="input" (mode central or sharded), imports the result and trains it on its own server
until the end of input, with prefetch threads. With --kill-after, it writes <run dir>/kill after that
many steps (the test then kills input task 1) and reports the error it gets.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import smartstage as ss  # noqa: E402
from tests.cluster import graphs  # noqa: E402

MAX_STEPS = 10000


def train(sess, names: dict, on_step=None) -> tuple[list, BaseException | None]:
    """Steps until the end of input; (steps, the error that ended them or None)."""
    options = tf.compat.v1.RunOptions(timeout_in_ms=graphs.STEP_MILLIS)
    steps = []
    try:
        with ss.start_prefetch_threads(sess):
            try:
                while len(steps) < MAX_STEPS:
                    loss, rows, _ = sess.run([names["loss"], names["rows"], names["train_op"]], options=options)
                    steps.append([float(loss), [int(r) for r in rows]])
                    if on_step is not None:
                        on_step(len(steps))
            except tf.errors.OutOfRangeError:
                pass
    except Exception as error:  # noqa: BLE001  reported to the test (the prefetch error, as itself)
        return steps, error
    return steps, None


def run_graph(meta, target: str, names: dict, on_step=None):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
        init = [tf.compat.v1.global_variables_initializer(), graph.get_operation_by_name(names["init"])]
        sess = tf.compat.v1.Session(target, graph=graph)
        sess.run(init)
        steps, error = train(sess, names, on_step)
        if error is None:
            sess.close()
        # else: TensorFlow's Session.close() waits on cleanup RPCs to the dead task (docs/scale-out.md);
        # a job whose input task died exits and is restarted, so this process just ends.
        return steps, error


def main(argv: list[str]) -> None:
    faulthandler.dump_traceback_later(75, exit=True)  # a hang shows where, then ends the process
    cluster_json, mode, tasks, run_dir = argv[1], argv[2], int(argv[3]), argv[4]
    kill_after = int(argv[argv.index("--kill-after") + 1]) if "--kill-after" in argv else None
    slow = int(argv[argv.index("--slow-millis") + 1]) if "--slow-millis" in argv else 0
    rows = int(argv[argv.index("--rows") + 1]) if "--rows" in argv else graphs.ROWS
    cluster = tf.train.ClusterSpec(json.loads(cluster_json))
    server = tf.distribute.Server(cluster, job_name="trainer", task_index=0)
    graph = tf.Graph()
    with graph.as_default():
        names = graphs.build(rows=rows, slow_millis=slow)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input", input_tasks=tasks, input_mode=mode)
    result = ss.optimize(meta, config, targets=[names["loss"], names["rows"], names["train_op"]])
    report = {"summary": [line for r in result.reports for line in r.summary] if hasattr(result, "reports") else [],
              "devices": sorted({n.device for n in result.graph_def.node})}
    if kill_after is None:
        report["reference"], error = run_graph(meta, "", names)
        assert error is None, error
    def on_step(step: int) -> None:
        if kill_after is not None and step == kill_after:
            open(os.path.join(run_dir, "kill"), "w").close()
            report["kill_requested_at"] = time.monotonic()
        if kill_after is not None and step > kill_after:
            time.sleep(0.05)
    steps, error = run_graph(result.meta_graph_def, server.target, names, on_step)
    report["steps"] = steps
    report["error"] = None if error is None else {"type": type(error).__name__, "message": str(error)[:2000],
                                                   "task": getattr(error, "task", None)}
    report["error_at"] = time.monotonic()
    print(json.dumps(report), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the server has no shutdown; leave at once


if __name__ == "__main__":
    main(sys.argv)
