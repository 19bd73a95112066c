"""One task of the local test cluster, run in its own process by test_cluster.py.

    python -m tests.session.cluster_task ps 0 <cluster json> <run dir>
    python -m tests.session.cluster_task worker 1 <cluster json> <run dir>

A worker builds its own graph under replica_device_setter, trains STEPS steps with the flag on
through ss.MonitoredTrainingSession on its own server, and prints one JSON line with what it saw:
the devices of its stage ops, of the ops that moved, and of the variables, and its losses.
Every wait is bounded: the other worker creates its session once the chief has initialized the
variables, and the chief waits for that session before training, so both train at once.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

START = time.monotonic()

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

from tests.bounds import HANG_MILLIS, HANG_SECONDS  # noqa: E402

STEPS = 20
WAIT_SECONDS = HANG_SECONDS
STEP_MILLIS = HANG_MILLIS


def wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {WAIT_SECONDS:.0f} s waiting for {path}")
        time.sleep(0.05)


def log(message: str) -> None:
    print(f"[{time.monotonic() - START:6.1f} s] {message}", file=sys.stderr, flush=True)


def run_worker(index: int, cluster: tf.train.ClusterSpec, run_dir: str) -> dict:
    import smartstage as ss  # the parameter server needs only TensorFlow
    from tests.session.graphs import lanes_flag, small_model

    log("imported")
    server = tf.distribute.Server(cluster, job_name="worker", task_index=index, start=True)
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{index}", cluster=cluster)
        with tf.compat.v1.device(setter):
            model = small_model()
        config = lanes_flag()  # each worker's own rebuilt buffer and prefetch side (lanes)
        config.device_filters.extend(["/job:ps", f"/job:worker/task:{index}"])
        run_options = tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)
        if index != 0:
            # A non-chief session that finds the variables uninitialized sleeps 30 s before it looks
            # again (SessionManager's recovery wait): create it once the chief has initialized them.
            wait_for(os.path.join(run_dir, "worker0.ready"))
        log("creating the session")
        with ss.MonitoredTrainingSession(master=server.target, is_chief=index == 0, config=config,
                                         hooks=[ss.make_prefetch_hook()], max_wait_secs=WAIT_SECONDS,
                                         save_checkpoint_secs=None, save_summaries_steps=None,
                                         log_step_count_steps=None) as sess:
            log("session created")
            open(os.path.join(run_dir, f"worker{index}.ready"), "w").close()
            if index == 0:
                wait_for(os.path.join(run_dir, "worker1.ready"))
            log("training")
            losses = [float(sess.run([model.loss, model.train_op], options=run_options)[0]) for _ in range(STEPS)]
        log("closed")
        (stage,) = sess.smart_stage.stages
        return {
            "task": index,
            "losses": losses,
            "stage_devices": {role: graph.get_operation_by_name(name).device for role, name in stage.new_ops.items()},
            "moved_devices": sorted({graph.get_operation_by_name(n).device for n in stage.moved}),
            "variable_devices": sorted({v.device for v in tf.compat.v1.global_variables()}),
        }


def main(argv: list[str]) -> None:
    job, index, cluster_json, run_dir = argv[1], int(argv[2]), argv[3], argv[4]
    cluster = tf.train.ClusterSpec(json.loads(cluster_json))
    if job == "ps":
        server = tf.distribute.Server(cluster, job_name="ps", task_index=index, start=True)
        print(json.dumps({"ps": index, "target": server.target}), flush=True)
        server.join()  # the test kills this process
        return
    print(json.dumps(run_worker(index, cluster, run_dir)), flush=True)


if __name__ == "__main__":
    main(sys.argv)
