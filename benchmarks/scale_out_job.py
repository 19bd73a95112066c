"""The scale-out benchmarks' job, shared by benchmarks/scale_out.py and benchmarks/scale_out_cpu.py.

    meta, init, train = job_graph(read_millis=40, lanes=1, tasks=2)   # an optimized MetaGraphDef
    rate = measure(meta, init, train, server.target, steps=60, warmup=10)

The job (a tf.data source, an optional storage wait and CPU-heavy preprocessing, an optional CPU-heavy
training step), the loopback input-task servers and the timed steps. TensorFlow is imported inside the
functions: the CPU-bound run pins its process to a core before TensorFlow starts a thread.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
BATCH = 64
ROWS = 10_000_000


def serve(argv: list[str]) -> None:
    job, index, spec, lifetime = argv[0], int(argv[1]), json.loads(argv[2]), float(argv[3])
    if len(argv) > 4:  # the task's cores, before TensorFlow starts a thread (threads inherit the affinity)
        os.sched_setaffinity(0, {int(c) for c in argv[4].split(",")})
    import tensorflow as tf

    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index)
    time.sleep(lifetime)


def free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def heavy(x, work: int):
    """CPU-bound stateless preprocessing: `work` rounds of elementwise math on a [batch, 256] tensor."""
    import tensorflow as tf

    wide = tf.tile(x, [1, 64])  # [batch, 256]
    for _ in range(work):
        wide = tf.sin(wide) * 0.9 + tf.math.log1p(tf.abs(wide)) * 0.1
    return tf.reduce_mean(tf.reshape(wide, [-1, 4, 64]), axis=2)  # back to [batch, 4]: a small boundary


def build_job(read_millis: int, lanes: int, work: int = 0, train_work: int = 0):
    import tensorflow as tf

    import smartstage as ss
    from tensorflow.python.data.experimental.ops import testing

    ds = tf.data.Dataset.range(ROWS).map(lambda i: tf.cast(tf.stack([i % 97, i % 13, i % 7, i % 5]), tf.float32))
    iterator = tf.compat.v1.data.make_initializable_iterator(ds.batch(BATCH))
    x = iterator.get_next()
    if read_millis:
        slow = tf.data.Dataset.from_tensors(x).apply(testing.sleep(read_millis * 1000))
        x = tf.data.experimental.get_single_element(slow)             # the storage read: latency, no CPU
    x = tf.math.log1p(tf.abs(x)) * 2.0 + tf.sqrt(tf.abs(x) + 1.0)  # light stateless preprocessing
    if work:
        x = tf.identity(heavy(x, work), name="preprocessed")
    x = ss.staged(x, capacity=8, num_threads=lanes) if lanes else ss.staged(x)  # 0: the defaults (AUTOTUNE)
    if train_work:  # a CPU-bound training step: train_work dense layers of 512 on the trainer's own core
        hidden = x
        for layer in range(train_work):
            width = int(hidden.shape[-1])
            kernel = tf.compat.v1.get_variable(f"dense_{layer}", [width, 512],
                                               initializer=tf.compat.v1.glorot_uniform_initializer(seed=layer))
            hidden = tf.tanh(tf.matmul(hidden, kernel))
        x = hidden
    w = tf.compat.v1.get_variable("w", [int(x.shape[-1]), 1], initializer=tf.compat.v1.constant_initializer(0.1))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0), name="loss")
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.001).minimize(loss, name="train_op")
    return iterator.initializer.name, train_op.name


def job_graph(read_millis: int, lanes: int, tasks: int, work: int = 0, train_work: int = 0, lanes_per_task: int = 1):
    import tensorflow as tf

    import smartstage as ss

    graph = tf.Graph()
    with graph.as_default():
        init, train = build_job(read_millis, lanes, work, train_work)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input" if tasks else None,
                                   input_tasks=tasks)
    extra = {"input_num_threads_per_task": lanes_per_task} if tasks and lanes_per_task > 1 else {}
    return ss.optimize(meta, config, targets=[train, "loss"], **extra).meta_graph_def, init, train


def measure(meta, init: str, train: str, target: str, steps: int, warmup: int, cpu: list | None = None,
             others=None, other_cpu: list | None = None) -> float:
    """Steps/s of one configuration; with `cpu`, also the trainer process's CPU per step; with `others` (a
    function giving the input tasks' CPU seconds so far), their CPU per step into `other_cpu`."""
    import tensorflow as tf

    import smartstage as ss

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
        config = tf.compat.v1.ConfigProto(isolate_session_state=True)  # fresh buffers per session
        with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), graph.get_operation_by_name(init)])
            with ss.start_prefetch_threads(sess):
                for _ in range(warmup):
                    sess.run(train)
                start, used = time.perf_counter(), time.process_time()
                tasks_used = others() if others is not None else 0.0
                for _ in range(steps):
                    sess.run(train)
                rate = steps / (time.perf_counter() - start)
                if cpu is not None:  # the trainer process's CPU per step (its server's threads included)
                    cpu.append((time.process_time() - used) / steps)
                if others is not None and other_cpu is not None:
                    other_cpu.append((others() - tasks_used) / steps)
                return rate


__all__ = ["BATCH", "OUT", "REPO", "ROWS", "build_job", "free_ports", "heavy", "job_graph", "measure", "serve"]
