"""Running an example graph for a few steps: a plain Session or a MonitoredTrainingSession.

    losses = run_steps(model.graph, [model.loss, model.train_op], steps=20, init_op=model.init_op)
    rate = steps_per_second(model.graph, model.train_op, steps=200, init_op=model.init_op)

Both run in either of TensorFlow's modes (the graph is entered: TF2's eager mode needs no switch off).
Both work on a graph imported from an exported MetaGraphDef too (fetch by name): initialisation
then comes from the standard collections (variables, local variables, tables, LOCAL_INIT_OP),
which is also what a MonitoredTrainingSession uses.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import tensorflow as tf


def default_init_op(graph: tf.Graph) -> tf.Operation:
    """An init op from `graph`'s collections (adds a few nodes to `graph`)."""
    with graph.as_default():
        local = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOCAL_INIT_OP)
        if not local:
            local = [tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer()]
        return tf.group(tf.compat.v1.global_variables_initializer(), *local)


def run_steps(
    graph: tf.Graph,
    fetches: Any,
    steps: int,
    *,
    init_op: Optional[Any] = None,
    monitored: bool = False,
    hooks: Sequence[tf.compat.v1.train.SessionRunHook] = (),
    config: Optional[tf.compat.v1.ConfigProto] = None,
) -> list[Any]:
    """Runs `fetches` `steps` times (fewer if the input ends) and returns every step's values.

    Plain session: runs `init_op` (default: `default_init_op`), starts the QUEUE_RUNNERS
    collection, runs, then stops and joins them. `monitored=True`: a MonitoredTrainingSession
    with `hooks`, no checkpoints and no summaries (it initialises from the collections itself).
    """
    results: list[Any] = []
    if monitored:
        with graph.as_default():
            session = tf.compat.v1.train.MonitoredTrainingSession(
                hooks=list(hooks),
                config=config,
                save_checkpoint_secs=None,
                save_checkpoint_steps=None,
                save_summaries_steps=None,
                save_summaries_secs=None,
                log_step_count_steps=None,
            )
            with session:
                while len(results) < steps and not session.should_stop():
                    results.append(session.run(fetches))
        return results
    init = init_op if init_op is not None else default_init_op(graph)
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as session:  # eager mode too
        session.run(init)
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(session, coord=coord)
        try:
            for _ in range(steps):
                results.append(session.run(fetches))
        except tf.errors.OutOfRangeError:
            pass
        finally:
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=10)
    return results


def steps_per_second(
    graph: tf.Graph,
    train_op: Any,
    steps: int,
    *,
    warmup: int = 10,
    init_op: Optional[Any] = None,
    config: Optional[tf.compat.v1.ConfigProto] = None,
) -> float:
    """Training steps per second of a plain loop over `train_op`, after `warmup` untimed steps."""
    init = init_op if init_op is not None else default_init_op(graph)
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as session:  # eager mode too
        session.run(init)
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(session, coord=coord)
        try:
            for _ in range(warmup):
                session.run(train_op)
            start = time.perf_counter()
            for _ in range(steps):
                session.run(train_op)
            return steps / (time.perf_counter() - start)
        finally:
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=10)
