"""The trainer of the session-flag scale-out test, in its own process: trains with the flag, prints one JSON line.

    python -m tests.cluster.session_trainer <cluster json>

It builds tests/cluster/graphs.py four times, each into a fresh tf.Graph, and trains it on its own server
until the end of input with the flag on and input_job="input" (the task count from the ClusterSpec):
through ss.Session and through ss.MonitoredTrainingSession, in central and in sharded mode.
The reference is the same graph without the flag (ss.Session, in-process). Per run it reports the steps
(loss, row ids), the devices of what the live rewrite placed (task 0's body, task 1's copies, the inputs
of each remote lane's enqueue), the batches each lane produced, and for central mode the devices a traced
run of task 1's copy of the body ran on.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import smartstage as ss  # noqa: E402
from smartstage.runtime.stage.metadata import stage_defs  # noqa: E402
from smartstage.runtime.lanes.remote import remote_plan  # noqa: E402
from tests.cluster import graphs  # noqa: E402

MAX_STEPS = 1000
STEP_OPTIONS = tf.compat.v1.RunOptions(timeout_in_ms=graphs.STEP_MILLIS)


def steps_until_end(run) -> list:
    """[loss, row ids] of every step until the end of input."""
    steps = []
    try:
        while len(steps) < MAX_STEPS:
            loss, rows, _ = run()
            steps.append([float(loss), [int(r) for r in rows]])
    except tf.errors.OutOfRangeError:
        pass
    return steps


def reference() -> list:
    """The same graph, the flag off, in-process."""
    with tf.Graph().as_default() as graph:
        names = graphs.build()
        with ss.Session(graph=graph) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), names["init"]])
            return steps_until_end(lambda: sess.run([names["loss"], names["rows"], names["train_op"]]))


def placement(graph: tf.Graph) -> dict:
    """Where the live rewrite put the prefetch side, read from the run graph."""
    stage = stage_defs(graph)[0]
    put = graph.get_operation_by_name(stage.put_node)
    lanes = sorted(op.name for op in graph.get_operations()
                   if op.name.startswith(f"{stage.name}/remote_lanes/lane_") and op.name.endswith("/enqueue"))
    return {
        "marker": remote_plan(graph, stage.name) is not None,
        "num_threads": stage.num_threads,
        "put_input_devices": sorted({t.op.device for t in put.inputs[1:]}),
        "copy_devices": sorted({op.device for op in graph.get_operations()
                                if op.name.startswith(f"{stage.name}/input_task_1/")}),
        "lane_input_devices": [sorted({t.op.device for t in graph.get_operation_by_name(name).inputs[1:]})
                               for name in lanes],
    }


def traced_copy_devices(graph: tf.Graph, run) -> list[str]:
    """The devices a traced run of task 1's copy of the body ran on (central: fed made-up head values)."""
    stage = stage_defs(graph)[0]
    plan = remote_plan(graph, stage.name)
    put = graph.get_operation_by_name(stage.put_node)
    copies = [graph.get_tensor_by_name(f"{stage.name}/input_task_1/{t.op.name}:{t.value_index}")
              for t in put.inputs[1:] if t.op.device == plan.tasks[0]]
    feeds = {}
    for name in plan.cut:
        tensor = graph.get_tensor_by_name(name)
        shape = [d if d is not None else graphs.BATCH for d in tensor.shape.as_list()]
        feeds[tensor] = np.full(shape, b"1" if tensor.dtype == tf.string else 1, tensor.dtype.as_numpy_dtype)
    metadata = tf.compat.v1.RunMetadata()
    run(copies, feeds, tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE), metadata)
    return sorted({d.device for d in metadata.step_stats.dev_stats})


def flag_config(cluster: tf.train.ClusterSpec, mode: str) -> tf.compat.v1.ConfigProto:
    # The task count comes from the ClusterSpec, not from cluster_def: a session config whose cluster_def names
    # the server's own task is refused by TensorFlow (ClusterSpec propagation), so a session never gets one.
    # isolate_session_state: the four runs share the trainer's server, never their queues or variables.
    config = tf.compat.v1.ConfigProto(isolate_session_state=True)
    return ss.enable_smart_stage(config, input_job="input", input_tasks=cluster.num_tasks("input"), input_mode=mode)


def with_session(target: str, cluster: tf.train.ClusterSpec, mode: str) -> dict:
    with tf.Graph().as_default() as graph:
        names = graphs.build()
        with ss.Session(target, graph=graph, config=flag_config(cluster, mode)) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), names["init"]])
            seen = {"steps": steps_until_end(lambda: sess.run([names["loss"], names["rows"], names["train_op"]],
                                                              options=STEP_OPTIONS))}
            seen["lane_batches"] = list(sess.prefetch_threads.stats()[0].lane_batches)
            if mode == "central":
                seen["traced"] = traced_copy_devices(graph, lambda f, d, o, m: tf.compat.v1.Session.run(
                    sess, f, feed_dict=d, options=o, run_metadata=m))
        seen.update(placement(graph))
        return seen


def with_monitored_session(target: str, cluster: tf.train.ClusterSpec, mode: str) -> dict:
    with tf.Graph().as_default() as graph:
        names = graphs.build()
        hook = ss.make_prefetch_hook()
        init = graph.get_operation_by_name(names["init"])
        scaffold = tf.compat.v1.train.Scaffold(local_init_op=tf.group(tf.compat.v1.local_variables_initializer(), init))
        with ss.MonitoredTrainingSession(master=target, config=flag_config(cluster, mode), scaffold=scaffold,
                                         hooks=[hook], log_step_count_steps=0) as sess:
            seen = {"steps": steps_until_end(lambda: sess.run([names["loss"], names["rows"], names["train_op"]],
                                                              options=STEP_OPTIONS))}
            seen["finalized"] = graph.finalized
            seen["lane_batches"] = list(hook.threads.stats()[0].lane_batches)
            if mode == "central":
                seen["traced"] = traced_copy_devices(graph, lambda f, d, o, m: sess.run_step_fn(
                    lambda step: step.session.run(f, feed_dict=d, options=o, run_metadata=m)))
        seen.update(placement(graph))
        return seen


def main(argv: list[str]) -> None:
    faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where, then ends the process
    cluster = tf.train.ClusterSpec(json.loads(argv[1]))
    server = tf.distribute.Server(cluster, job_name="trainer", task_index=0)
    report = {"reference": reference()}
    for mode in ("central", "sharded"):
        report[f"session/{mode}"] = with_session(server.target, cluster, mode)
        report[f"monitored/{mode}"] = with_monitored_session(server.target, cluster, mode)
    print(json.dumps(report), flush=True)
    os._exit(0)  # the server has no shutdown; leave at once


if __name__ == "__main__":
    main(sys.argv)
