"""Run a graph for N steps in a real session, and compare two graphs step by step.

    before = run_steps(meta_before, ["loss:0"], steps=20)
    after = run_steps(meta_after, ["loss:0"], steps=20)
    comparison = compare_runs(meta_before, meta_after, ["loss:0"], steps=20)
    assert comparison.identical, comparison.describe()

Each run imports the graph into a fresh tf.Graph (a MetaGraphDef keeps its collections: variables, table
initializers, queue runners, stage descriptions), initialises it, starts the queue runners and one prefetch
thread per stage (so batches arrive in input order), and fetches the same tensors every step until `steps`
or the end of input.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import queue_runner_pb2

from smartstage.errors import TargetError
from smartstage.graph.view import GraphView
from smartstage.graph.load import load_graph, stage_defs_of
from smartstage.graph.stages import PROTO_OF_KIND, find_stages
from smartstage.protos import StageDef

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass
class Run:
    """The values fetched at every step, and whether the input ended before `steps`."""

    fetches: list[str]
    values: list[list[np.ndarray]] = field(default_factory=list)
    ended: bool = False
    variables: dict[str, np.ndarray] = field(default_factory=dict)  # every global variable after the last step


AFTER_LAST_STEP = -1  # Mismatch.step of a variable compared after the run


@dataclass(frozen=True)
class Mismatch:
    step: int
    fetch: str
    before: object
    after: object


@dataclass(frozen=True)
class Comparison:
    before: Run
    after: Run
    mismatches: tuple[Mismatch, ...]

    @property
    def identical(self) -> bool:
        return not self.mismatches and len(self.before.values) == len(self.after.values)

    def describe(self) -> str:
        if self.identical:
            variables = f", then {len(self.before.variables)} variable(s)" if self.before.variables else ""
            return (f"identical: {len(self.before.values)} step(s), {len(self.before.fetches)} fetch(es) each"
                    + variables + (" (the input ended)" if self.before.ended else ""))
        if len(self.before.values) != len(self.after.values):
            return (f"different step counts: {len(self.before.values)} before, {len(self.after.values)} after")
        m = self.mismatches[0]
        if m.step == AFTER_LAST_STEP:
            return f"after the last step: {m.fetch} differs: before {m.before!r}, after {m.after!r}"
        return f"step {m.step}: {m.fetch} differs: before {m.before!r}, after {m.after!r}"


def _stage_defs(loaded) -> list[StageDef]:
    defs = stage_defs_of(loaded.meta_graph_def)
    view = GraphView(loaded.graph_def)
    covered = {d.put_node for d in defs}
    stages, _ = find_stages(view, defs)
    run_by_queue_runners = _queue_runner_puts(loaded.meta_graph_def)
    for s in stages:
        if s.put in covered or s.put in run_by_queue_runners:
            continue  # start_queue_runners runs this put: a second producer would reorder the batches
        closes = {bool(view.node(n).attr["cancel_pending_enqueues"].b): n
                  for n in s.related if view.op(n) in ("QueueCloseV2", "QueueClose")}
        # The cancel op wakes a put blocked on a full buffer when the run stops (a plain close does not).
        defs.append(StageDef(name=s.name, kind=PROTO_OF_KIND[s.kind], buffer_node=s.buffer, put_node=s.put,
                             take_node=s.take, close_node=closes.get(False, ""), cancel_node=closes.get(True, ""),
                             num_threads=1, capacity=1, closed_error_codes=[tf.errors.OUT_OF_RANGE],
                             origin="structural"))
    for d in defs:
        d.num_threads = 1  # one prefetch thread: batches in input order, runs comparable step by step
    return defs


def _queue_runner_puts(meta) -> set[str]:
    """The enqueue ops the QueueRunners of a MetaGraphDef run."""
    key = tf.compat.v1.GraphKeys.QUEUE_RUNNERS
    if meta is None or key not in meta.collection_def:
        return set()
    puts: set[str] = set()
    for raw in meta.collection_def[key].bytes_list.value:
        puts.update(n.split(":")[0] for n in queue_runner_pb2.QueueRunnerDef.FromString(raw).enqueue_op_name)
    return puts


def _import(loaded, graph: tf.Graph):
    with graph.as_default():
        if loaded.meta_graph_def is not None:
            import smartstage.runtime  # noqa: F401  (registers the stage collection's proto functions)

            tf.compat.v1.train.import_meta_graph(loaded.meta_graph_def)
        else:
            tf.graph_util.import_graph_def(loaded.graph_def, name="")


def _init_ops(graph: tf.Graph, init_ops: Sequence[str] | None):
    if init_ops is not None:
        return [graph.as_graph_element(name) for name in init_ops]
    with graph.as_default():
        ops = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()]
        tables = graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
        if tables:
            ops.append(tf.group(*tables))
        return ops


def as_written_config(config: tf.compat.v1.ConfigProto | None = None) -> tf.compat.v1.ConfigProto:
    """`config` with TensorFlow's own graph rewrites off (Grappler, the classic optimizer's folding and CSE):
    they fold and fuse the main side differently once preprocessing arrives through a take, which changes
    the last bits of float results. Comparing runs means comparing the graphs as written."""
    result = tf.compat.v1.ConfigProto()
    if config is not None:
        result.CopyFrom(config)
    result.graph_options.rewrite_options.disable_meta_optimizer = True
    result.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    result.graph_options.optimizer_options.do_constant_folding = False
    result.graph_options.optimizer_options.do_common_subexpression_elimination = False
    return result


def run_steps(graph, fetches: Sequence[str], steps: int, *, init_ops: Sequence[str] | None = None,
              feed_dict: dict | None = None, config: tf.compat.v1.ConfigProto | None = None,
              progress: Progress | None = None, target: str = "") -> Run:
    """Runs `graph` (any form optimize() takes) for up to `steps` steps, fetching `fetches` each step.

    Without `config`, TensorFlow's own graph rewrites are off (see as_written_config). target: the session's
    master ("" in-process; "grpc://..." a cluster's trainer, see inspection/loopback.py)."""
    from smartstage.runtime.door import start_prefetch_threads
    from smartstage.runtime.stage.settings import STOP_JOIN_SECONDS

    loaded = load_graph(graph)
    graph_obj = tf.Graph()
    _import(loaded, graph_obj)
    try:
        targets = [graph_obj.as_graph_element(f) for f in fetches]
    except (KeyError, ValueError) as e:
        raise TargetError(f"cannot fetch {fetches}: {e}") from None
    feeds = {graph_obj.as_graph_element(k): v for k, v in (feed_dict or {}).items()}
    run = Run(list(fetches))
    with tf.compat.v1.Session(target, graph=graph_obj,
                              config=config if config is not None else as_written_config()) as sess:
        sess.run(_init_ops(graph_obj, init_ops))
        coord = tf.compat.v1.train.Coordinator()
        queue_threads = tf.compat.v1.train.start_queue_runners(sess=sess, coord=coord)
        threads = start_prefetch_threads(sess, coord=coord, stages=_stage_defs(loaded))
        try:
            for step in range(steps):
                try:
                    run.values.append([np.asarray(v) for v in sess.run(targets, feed_dict=feeds)])
                except tf.errors.OutOfRangeError:
                    threads.raise_if_error()
                    run.ended = True
                    break
                if progress:
                    progress(step + 1)
            threads.raise_if_error()
            # What the steps trained: identical runs leave identical variables, even when the fetches
            # (a train op alone) carry no value.
            variables = {v.op.name: v for v in graph_obj.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
            run.variables = dict(zip(variables, (np.asarray(x) for x in sess.run(list(variables.values())))))
        finally:
            threads.request_stop()  # runs each stage's cancel op: a put blocked on a full buffer wakes
            coord.request_stop()
            # Closing the session ends the runs no cancel op reaches (a put blocked upstream, a queue without a
            # cancel op), so the joins below return at once instead of waiting out their timeout.
            sess.close()
            if not threads.join(STOP_JOIN_SECONDS):
                logger.warning("prefetch threads still running %.0f s after the run: %s", STOP_JOIN_SECONDS,
                               [t.name for t in threads.threads if t.is_alive()])
            try:
                coord.join(queue_threads, stop_grace_period_secs=STOP_JOIN_SECONDS)
            except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
                pass
    return run


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def compare_runs(before, after, fetches: Sequence[str], steps: int, *, after_fetches: Sequence[str] | None = None,
                 **kwargs) -> Comparison:
    """Runs both graphs and compares every fetched value at every step (exactly: same dtype, shape, bits).

    `after_fetches` names the same tensors in the rewritten graph when they differ (see
    OptimizeResult.fetch_map()); by default the names are the same.
    """
    run_before = run_steps(before, fetches, steps, **kwargs)
    run_after = run_steps(after, after_fetches or fetches, steps, **kwargs)
    mismatches = []
    for step, (vb, va) in enumerate(zip(run_before.values, run_after.values)):
        for name, b, a in zip(fetches, vb, va):
            if not _same(b, a):
                mismatches.append(Mismatch(step, name, b, a))
    for name, b in run_before.variables.items():
        a = run_after.variables.get(name)
        if a is None or not _same(b, a):
            mismatches.append(Mismatch(AFTER_LAST_STEP, f"variable {name}", b, a))
    return Comparison(run_before, run_after, tuple(mismatches))


