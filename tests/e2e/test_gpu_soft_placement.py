"""The GPU-placed graphs run on this CPU-only machine (allow_soft_placement=True), with values identical to
the unoptimized graph at every step, the end of input reaching the main loop after the last batch, and the
CPU stage's error and shutdown guarantees intact. A GPU machine would run the same graphs with the prefetch
side on the CPU and the buffer on the GPU; here soft placement folds every GPU device onto the CPU.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
import tensorflow as tf

from smartstage.inspection.replay import compare_runs
from smartstage.config.options import enable_smart_stage
from smartstage.optimizer import optimize
from smartstage.runtime import make_prefetch_hook, staged, start_prefetch_threads
from tests.bounds import HANG_MILLIS

SOFT = tf.compat.v1.ConfigProto(allow_soft_placement=True)
GPU_ON = enable_smart_stage(do_smart_stage_gpu=True)
GPU_STREAMS = enable_smart_stage(do_smart_stage_gpu=True, stage_multi_stream=True)
ROWS, BATCH = 24, 2
BATCHES = ROWS // BATCH
STEP_MILLIS = HANG_MILLIS  # a main step that would hang because of a bug fails instead


def bounded() -> tf.compat.v1.RunOptions:
    return tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)


def csv_lines(rows=ROWS, bad_row=None):
    rng = np.random.default_rng(0)
    lines = [f"{int(rng.integers(0, 2))},c{int(rng.integers(0, 20))},{rng.standard_normal():.4f}" for _ in range(rows)]
    if bad_row is not None:
        lines[bad_row] = "not,a,number,row"
    return lines


def model(device: str, rows=ROWS, bad_row=None, stream_id=0):
    #   lines -> batch -> decode_csv -> put ~~ take -> hash -> embedding(w) -> reshape(shape(dense)) -> loss
    #                                             \-> cast(label) -----------------------------------/
    g = tf.Graph()
    with g.as_default(), tf.device(device):
        tf.compat.v1.set_random_seed(1)
        ds = tf.data.Dataset.from_tensor_slices(csv_lines(rows, bad_row)).batch(BATCH)
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        label, cat, dense = tf.io.decode_csv(batch, [[0], [""], [0.0]])
        f = staged({"label": label, "cat": cat, "dense": dense}, stage_subgraph_stream_id=stream_id)
        ids = tf.strings.to_hash_bucket_fast(f["cat"], 20)
        w = tf.compat.v1.get_variable("w", [20, 1], initializer=tf.compat.v1.random_uniform_initializer(seed=3))
        emb = tf.reshape(tf.nn.embedding_lookup(w, ids), tf.shape(f["dense"]))
        scale = tf.constant(0.5)
        pred = emb * f["dense"] * scale
        loss = tf.reduce_mean(tf.square(pred - tf.cast(f["label"], tf.float32)))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        # the loss of every step depends on every earlier update of w: identical losses, identical training
        return tf.compat.v1.train.export_meta_graph(), [loss.name, train_op.name]


@pytest.mark.parametrize("config", [GPU_ON, GPU_STREAMS], ids=["gpu", "gpu+multi_stream"])
def test_single_machine_values_identical_step_by_step_and_input_ends(config):
    meta, fetches = model("/device:GPU:0", stream_id=1)
    result = optimize(meta, config)
    placement = result.extra["gpu_placement"]["stage"]
    assert placement.buffer_device_after == "/device:GPU:0"
    assert any(c.after == "/device:CPU:0" for c in placement.device_changes)
    comparison = compare_runs(meta, result.meta_graph_def, fetches, BATCHES + 5, config=SOFT)
    assert comparison.identical, comparison.describe()
    # every batch reached the step, then the end of input did
    assert len(comparison.after.values) == BATCHES and comparison.after.ended
    assert comparison.before.ended


def _import(meta):
    graph = tf.Graph()
    with graph.as_default():
        import smartstage.runtime  # noqa: F401  (the stage collection's proto functions)

        tf.compat.v1.train.import_meta_graph(meta)
    return graph


def test_monitored_session_with_the_prefetch_hook_trains_every_batch_then_stops():
    meta, (loss, train_op) = model("/device:GPU:0")
    result = optimize(meta, GPU_ON)
    graph = _import(result.meta_graph_def)
    steps = 0
    with graph.as_default():
        with tf.compat.v1.train.MonitoredTrainingSession(config=SOFT, hooks=[make_prefetch_hook()]) as sess:
            while not sess.should_stop():
                sess.run(train_op, options=bounded())
                steps += 1
    assert steps == BATCHES


def test_an_error_on_the_prefetch_side_reaches_the_main_loop_as_that_error():
    meta, (loss, _) = model("/device:GPU:0", bad_row=7)
    result = optimize(meta, GPU_ON)
    graph = _import(result.meta_graph_def)
    seen = 0
    with tf.compat.v1.Session(graph=graph, config=SOFT) as sess:
        sess.run([v.initializer for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)])
        with pytest.raises(tf.errors.InvalidArgumentError, match="Expect 3 fields"):
            with start_prefetch_threads(sess):
                while True:
                    try:
                        sess.run(loss, options=bounded())
                        seen += 1
                    except tf.errors.OutOfRangeError:
                        break
    assert seen <= 7 // BATCH  # batches before the bad row only; the error did not pass for an end of input


def test_stopping_the_prefetch_threads_wakes_and_closes_the_gpu_placed_buffer():
    meta, (loss, _) = model("/device:GPU:0", rows=400)
    result = optimize(meta, GPU_ON)
    graph = _import(result.meta_graph_def)
    with tf.compat.v1.Session(graph=graph, config=SOFT) as sess:
        sess.run([v.initializer for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)])
        threads = start_prefetch_threads(sess)
        sess.run(loss, options=bounded())
        assert threads.stop()  # the put blocked on a full buffer woke up: every thread ended
        drained = 0
        with pytest.raises(tf.errors.OutOfRangeError):
            for _ in range(10):  # what was buffered may still be taken, then the closed buffer says so
                sess.run(loss, options=bounded())
                drained += 1
        assert drained <= 2


# -- a two-worker cluster on loopback, in this process ---------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{_free_port()}", f"localhost:{_free_port()}"]})
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, start=True) for i in range(2)]
    return servers


def _run_on(target, meta, fetches, steps):
    """Runs `meta` on `target` for up to `steps` steps: values per step, and whether the input ended."""
    tf.compat.v1.Session.reset(target)  # queues, iterators and variables live on the workers between sessions
    graph = _import(meta)
    values, ended = [], False
    with tf.compat.v1.Session(target, graph=graph, config=SOFT) as sess:
        sess.run([v.initializer for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)])
        with start_prefetch_threads(sess):
            for _ in range(steps):
                try:
                    values.append(sess.run(fetches, options=bounded()))
                except tf.errors.OutOfRangeError:
                    ended = True
                    break
    return values, ended


@pytest.mark.cluster
def test_cluster_graph_on_worker_1_runs_with_identical_values(cluster):
    meta, fetches = model("/job:worker/replica:0/task:1/device:GPU:0")
    result = optimize(meta, GPU_ON)
    placement = result.extra["gpu_placement"]["stage"]
    assert placement.buffer_device_after == "/job:worker/replica:0/task:1/device:GPU:0"
    assert {c.after for c in placement.device_changes if c.why != "stage"} == {
        "/job:worker/replica:0/task:1/device:CPU:0"}
    target = cluster[0].target
    before, before_ended = _run_on(target, meta, fetches, BATCHES + 3)
    after, after_ended = _run_on(target, result.meta_graph_def, fetches, BATCHES + 3)
    assert before_ended and after_ended
    assert len(before) == len(after) == BATCHES
    for step, (b, a) in enumerate(zip(before, after)):
        assert np.array_equal(b[0], a[0]), f"step {step}: the loss differs: {b[0]} vs {a[0]}"


def test_dlrm_example_on_a_gpu_holds_every_rule_and_trains_identically(tmp_path):
    from smartstage.examples import build_dlrm, export_meta_graph_def
    from smartstage.examples.data import prepare_criteo
    from tests.passes.gpu.test_placement import check_placement_rules

    files = prepare_criteo(tmp_path, num_rows=64, seed=0, vocabulary_max_size=20)
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        dlrm = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=staged)
    meta = export_meta_graph_def(graph)
    result = optimize(meta, GPU_STREAMS)
    check_placement_rules(result)
    placement = result.extra["gpu_placement"]["stage"]
    assert placement.buffer_device_after == "/device:GPU:0"
    assert sum(b.memory == "device" for b in placement.boundary) > 10
    comparison = compare_runs(meta, result.meta_graph_def, [dlrm.loss.name, dlrm.train_op.name], 4, config=SOFT)
    assert comparison.identical, comparison.describe()
