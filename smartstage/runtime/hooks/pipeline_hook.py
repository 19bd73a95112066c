"""`make_pipeline_hook()`: see the pipeline of every stage while training, with a one-line verdict.

    before:  hooks=[ss.make_prefetch_hook()]                                  # fast or slow, and why?
    after:   hooks=[ss.make_prefetch_hook(), ss.make_pipeline_hook(every_n_steps=100, summary_dir=logdir)]
             # INFO stage 'stage' @ step 200: input-bound: the step waits 29.8 ms for input per step ...

What is measured, per report window of `every_n_steps` steps:
- step time: from the hook's before_run to its after_run (the step's own run, waits included);
  steps/s: steps over the window's wall time (the user's Python between steps included).
- consumer wait: how long the step's take waited for a batch, read from the step's own trace
  (RunOptions SOFTWARE_TRACE, step_stats of the take node, as stock ProfilerHook reads them) on one
  step in `sample_every_n_steps`; the other steps run untraced.
- buffer occupancy: the stage's size op, run just before each sampled step (mean and last, of the
  capacity in force).
- producer time per batch and producer wait (the put blocked on a full buffer), num_threads, capacity,
  pool, order and what AUTOTUNE chose: the prefetch threads' own stats (PrefetchThreads.stats()),
  found through the graph (runner.latest_prefetch_threads), so any way of starting them works.

A stage folded into its iterator's dataset (passes/fold_dataset.py: no buffer, no thread of ours) is
watched through the same trace and nothing else: its consumer wait is the wait of the step's own read of
the iterator (`<stage>/dataset_fold/IteratorGetNext`), tf.data's prefetch buffer empty; the map's
parallelism and the prefetch buffer come from the dataset's ops in the graph. No run is added: the
sampled step carries the trace, and no buffer size is read (occupancy unknown).

The verdict (thresholds below): input-bound when the step waits for input at least
INPUT_BOUND_WAIT of its time; training-bound when it waits at most TRAINING_BOUND_WAIT and the
buffer holds at least FULL_OCCUPANCY of its capacity before a step; balanced otherwise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import tensorflow as tf

from smartstage.config.renamed import renamed_fields
from smartstage.graph.stage_names import DATASET_FOLD_SCOPE, folded_stage_of
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.stage.settings import AUTOTUNE, StageSettings
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.runtime.door import latest_prefetch_threads

if TYPE_CHECKING:
    from smartstage.runtime.door import PipelineStats

logger = logging.getLogger(__name__)

INPUT_BOUND_WAIT = 0.2     # the step waits for input >= 20% of its time: input-bound
TRAINING_BOUND_WAIT = 0.05  # the step waits <= 5% of its time ...
FULL_OCCUPANCY = 0.5        # ... and the buffer is at least half full before a step: training-bound
VERDICT_CODES = {"input-bound": 1.0, "balanced": 0.0, "training-bound": -1.0}
TAG_PREFIX = "smartstage"


@renamed_fields({"lanes": "num_threads"})
@dataclass(frozen=True)
class PipelineReport:
    """One stage's pipeline over the last report window (times in milliseconds).

    occupancy / last_occupancy: batches in the buffer just before a sampled step (mean / last; None
    when the stage has no size op); consumer_wait_ms: mean wait of the step's take (None: no sampled
    step read this stage); producer_ms: prefetch work per batch (head + body); producer_wait_ms: mean
    wait of a move into a full buffer (0 with one lane: there the put's own wait is in producer_ms);
    num_threads: the prefetch threads producing now (staged()'s num_threads; folded: the map's parallelism);
    autotuned: the settings AUTOTUNE picks, by name ("num_threads", "capacity", "pool").
    """

    stage: str
    step: int
    steps: int
    steps_per_second: float
    step_ms: float
    consumer_wait_ms: float | None
    occupancy: float | None
    last_occupancy: int | None
    capacity: int
    producer_ms: float
    producer_wait_ms: float
    batches_per_second: float
    num_threads: int
    ordered: bool
    own_pool: bool
    autotuned: tuple[str, ...]
    max_buffered_bytes: int
    verdict: str
    line: str
    stats: PipelineStats | None = None
    folded: bool = False  # folded into its dataset: num_threads = the map's parallelism, capacity = its prefetch

    @property
    def settings(self) -> str:
        """The settings in force, in words (as the log line shows them)."""
        if self.folded:
            def setting(value: int) -> str:
                return "AUTOTUNE" if value < 0 else str(value)
            return (f"folded into the dataset: map num_threads={setting(self.num_threads)} "
                    f"prefetch={setting(self.capacity)}")
        tuned = f"AUTOTUNE {'+'.join(self.autotuned)}" if self.autotuned else "explicit"
        return (f"num_threads={self.num_threads} capacity={self.capacity} pool={'own' if self.own_pool else 'shared'} "
                f"{'ordered' if self.ordered else 'unordered'} {tuned} "
                f"max_buffered_bytes={self.max_buffered_bytes / 2**20:g}MiB")


def classify(wait_fraction: float | None, occupancy_fraction: float | None) -> str:
    """The verdict from the share of step time spent waiting for input and the buffer's fill level."""
    if wait_fraction is None:
        return "unknown"
    if wait_fraction >= INPUT_BOUND_WAIT:
        return "input-bound"
    if wait_fraction <= TRAINING_BOUND_WAIT and (occupancy_fraction is None or occupancy_fraction >= FULL_OCCUPANCY):
        return "training-bound"
    return "balanced"


def _verdict_line(r: PipelineReport) -> str:
    wait = "?" if r.consumer_wait_ms is None else f"{r.consumer_wait_ms:.1f}"
    fill = "not measured" if r.occupancy is None else f"{r.occupancy:.1f}"  # a folded stage has no size op
    capacity = "autotuned" if r.capacity < 0 else str(r.capacity)
    holds = (f"the buffer holds {fill} of {capacity}" if r.occupancy is not None
             else f"the buffer's fill is {fill} (capacity {capacity})")
    if r.verdict == "input-bound" and r.folded:
        what = (f"input-bound: the step waits {wait} ms for the dataset per step ({r.step_ms:.1f} ms a step); the "
                f"limit is the dataset's map at {r.steps_per_second:.1f} batches/s: raise num_threads (the map's "
                "parallelism) or CPU, or move work to input tasks")
    elif r.verdict == "training-bound" and r.folded:
        what = (f"training-bound: the step waits {wait} ms of {r.step_ms:.1f} ms for the dataset; the limit is the "
                f"step at {r.steps_per_second:.1f} steps/s; more prefetch will not help")
    elif r.verdict == "input-bound":
        what = (f"input-bound: the step waits {wait} ms for input per step ({r.step_ms:.1f} ms a step); the limit is "
                f"the prefetch side at {r.steps_per_second:.1f} batches/s ({r.producer_ms:.1f} ms of prefetch work a "
                f"batch on {r.num_threads} thread(s)): raise num_threads (or let AUTOTUNE) or CPU, or move work to "
                "input tasks")
    elif r.verdict == "training-bound":
        what = (f"training-bound: the buffer stays full ({fill} of {capacity}); the limit is the step at "
                f"{r.steps_per_second:.1f} steps/s ({r.step_ms:.1f} ms a step); more prefetch will not help")
    elif r.verdict == "balanced":
        what = (f"balanced: the step waits {wait} ms of {r.step_ms:.1f} ms for input, {holds}; both sides run near "
                f"{r.steps_per_second:.1f} steps/s")
    else:
        what = "unknown: no sampled step read this stage yet"
    return f"stage '{r.stage}' @ step {r.step}: {what} [{r.settings}]"


class _Window:
    def __init__(self) -> None:
        self.started: float | None = None
        self.steps = 0
        self.step_seconds = 0.0
        self.waits: dict[str, list[float]] = {}
        self.sizes: dict[str, list[int]] = {}


class PipelineHook(tf.compat.v1.train.SessionRunHook):
    """Reports each stage's pipeline every `every_n_steps` steps: log line, TensorBoard scalars, `last_report`.

    With a plain tf.compat.v1.Session (no hooks run there), step through the hook instead:
    `hook.run(sess, train_op)` in place of `sess.run(train_op)`.
    """

    def __init__(self, every_n_steps: int = 100, summary_dir: str | None = None, log: bool = True,
                 sample_every_n_steps: int = 5):
        if every_n_steps < 1 or sample_every_n_steps < 1:
            raise ValueError(f"make_pipeline_hook(): every_n_steps={every_n_steps} and sample_every_n_steps="
                             f"{sample_every_n_steps} must be at least 1")
        self.every_n_steps = every_n_steps
        self.sample_every_n_steps = sample_every_n_steps
        self.summary_dir = summary_dir
        self.log = log
        self.reports: dict[str, PipelineReport] = {}
        self._step = 0
        self._window = _Window()
        self._started: float | None = None
        self._sampled = False
        self._writer = None

    @property
    def last_report(self) -> PipelineReport | None:
        """The latest report of the first stage (see `reports` for every stage by name)."""
        return next(iter(self.reports.values()), None)

    # -- hook protocol ----------------------------------------------------------------------------
    def before_run(self, run_context):
        self._step += 1
        if self._window.started is None:
            self._window.started = time.monotonic()
        self._sampled = (self._step - 1) % self.sample_every_n_steps == 0
        args = None
        if self._sampled:
            self._sample_sizes(run_context.session)
            args = tf.compat.v1.train.SessionRunArgs(
                None, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE))
        self._started = time.monotonic()
        return args

    def after_run(self, run_context, run_values) -> None:
        now = time.monotonic()
        w = self._window
        if self._started is not None:
            w.steps += 1
            w.step_seconds += now - self._started
        if self._sampled and run_values.run_metadata is not None:
            self._sample_waits(run_context.session.graph, run_values.run_metadata)
        if self._step % self.every_n_steps == 0:
            self.report(run_context.session.graph, now)

    def end(self, session) -> None:
        if self._writer is not None:
            self._writer.flush()

    def run(self, sess, fetches, feed_dict=None, options=None, run_metadata=None):
        """One step on a plain Session with this hook around it (what a MonitoredSession does)."""
        context = tf.compat.v1.train.SessionRunContext(tf.compat.v1.train.SessionRunArgs(fetches, feed_dict), sess)
        args = self.before_run(context)
        merged = tf.compat.v1.RunOptions()
        if options is not None:
            merged.CopyFrom(options)
        if args is not None and args.options is not None:
            merged.trace_level = max(merged.trace_level, args.options.trace_level)
        metadata = tf.compat.v1.RunMetadata()
        results = sess.run(fetches, feed_dict=feed_dict, options=merged, run_metadata=metadata)
        if run_metadata is not None:
            run_metadata.CopyFrom(metadata)
        self.after_run(context, tf.compat.v1.train.SessionRunValues(None, merged, metadata))
        return results

    # -- measuring ----------------------------------------------------------------------------------
    def _sample_sizes(self, sess) -> None:
        sizes = {d.name: f"{d.size_node}:0" for d in stage_defs(sess.graph) if d.size_node}
        if not sizes:
            return
        try:
            values = sess.run(sizes)
        except (tf.errors.OpError, RuntimeError) as error:  # a closing session: skip this sample
            logger.debug("pipeline hook: could not read the buffer sizes: %s", error)
            return
        for name, value in values.items():
            self._window.sizes.setdefault(name, []).append(int(value))

    def _sample_waits(self, graph: tf.Graph, metadata) -> None:
        takes = {d.take_node: d.name for d in stage_defs(graph)}
        takes.update({read: stage for stage, read in folded_reads(graph).items()})
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                stage = takes.get(node.node_name)
                if stage is not None:
                    # A take is an async op: all_end_rel_micros is when its batch arrived.
                    micros = max(node.all_end_rel_micros, node.op_end_rel_micros)
                    self._window.waits.setdefault(stage, []).append(micros / 1e6)

    # -- reporting ----------------------------------------------------------------------------------
    def report(self, graph: tf.Graph, now: float | None = None) -> list[PipelineReport]:
        """Closes the window: one report per stage, logged and written as scalars; returns them."""
        now = time.monotonic() if now is None else now
        w, self._window = self._window, _Window()
        threads = latest_prefetch_threads(graph)
        stats = {s.stage: s for s in threads.stats()} if threads is not None else {}
        steps_per_second = w.steps / max(now - (w.started or now), 1e-9)
        step_seconds = w.step_seconds / max(w.steps, 1)
        made = []
        for stage_def in stage_defs(graph):
            made.append(self._report_of(stage_def, stats.get(stage_def.name), w, steps_per_second, step_seconds))
        for stage, read in folded_reads(graph).items():
            made.append(self._folded_report_of(graph, stage, read, w, steps_per_second, step_seconds))
        for report in made:
            self.reports[report.stage] = report
            if self.log:
                logger.info("%s", report.line)
        self._write(made)
        return made

    def _report_of(self, d: StageDef, stats: PipelineStats | None, w: _Window, steps_per_second: float,
                   step_seconds: float) -> PipelineReport:
        waits, sizes = w.waits.get(d.name, []), w.sizes.get(d.name, [])
        wait = sum(waits) / len(waits) if waits else None
        occupancy = sum(sizes) / len(sizes) if sizes else None
        settings = StageSettings.from_def(d)
        capacity = stats.capacity if stats is not None else settings.capacity
        if stats is None and settings.tune_capacity:
            capacity = AUTOTUNE  # no producer yet: a tuned capacity is not known (no fill fraction)
        wait_fraction = None if wait is None else wait / max(step_seconds, 1e-9)
        occupancy_fraction = None if occupancy is None or capacity <= 0 else occupancy / capacity
        pool_tried = stats is None or bool(stats.decision.pool_tried) or not stats.decision.settled
        autotuned = tuple(name for name in settings.tuned if name != "pool" or pool_tried)
        report = PipelineReport(
            stage=d.name, step=self._step, steps=w.steps, steps_per_second=steps_per_second,
            step_ms=step_seconds * 1e3, consumer_wait_ms=None if wait is None else wait * 1e3,
            occupancy=occupancy, last_occupancy=sizes[-1] if sizes else None, capacity=capacity,
            producer_ms=0.0 if stats is None else (stats.head_seconds + stats.body_seconds) * 1e3,
            producer_wait_ms=0.0 if stats is None else stats.producer_wait_seconds * 1e3,
            batches_per_second=0.0 if stats is None else stats.batches_per_second,
            num_threads=stats.num_threads if stats is not None else settings.num_threads,
            ordered=settings.ordered, own_pool=stats.own_pool if stats is not None else d.use_stage_subgraph_thread_pool,
            autotuned=autotuned,
            max_buffered_bytes=settings.max_buffered_bytes,
            verdict=classify(wait_fraction, occupancy_fraction), line="", stats=stats)
        return _with_line(report)

    def _folded_report_of(self, graph: tf.Graph, stage: str, read: str, w: _Window, steps_per_second: float,
                          step_seconds: float) -> PipelineReport:
        waits = w.waits.get(stage, [])
        wait = sum(waits) / len(waits) if waits else None
        parallelism, buffer_size = dataset_settings(graph, stage)
        wait_fraction = None if wait is None else wait / max(step_seconds, 1e-9)
        report = PipelineReport(
            stage=stage, step=self._step, steps=w.steps, steps_per_second=steps_per_second,
            step_ms=step_seconds * 1e3, consumer_wait_ms=None if wait is None else wait * 1e3,
            occupancy=None, last_occupancy=None, capacity=buffer_size, producer_ms=0.0, producer_wait_ms=0.0,
            batches_per_second=steps_per_second, num_threads=parallelism, ordered=True, own_pool=False,
            autotuned=tuple(n for n, v in (("num_threads", parallelism), ("capacity", buffer_size)) if v < 0),
            max_buffered_bytes=0, verdict=classify(wait_fraction, None), line="", folded=True)
        return _with_line(report)

    def _write(self, reports: list[PipelineReport]) -> None:
        if self.summary_dir is None or not reports:
            return
        if self._writer is None:
            self._writer = tf.compat.v1.summary.FileWriterCache.get(self.summary_dir)
        summary = tf.compat.v1.Summary()
        for r in reports:
            values = {
                "verdict": VERDICT_CODES.get(r.verdict), "steps_per_second": r.steps_per_second,
                "step_ms": r.step_ms, "consumer_wait_ms": r.consumer_wait_ms, "occupancy": r.occupancy,
                "capacity": float(r.capacity), "producer_ms": r.producer_ms, "producer_wait_ms": r.producer_wait_ms,
                "batches_per_second": r.batches_per_second, "num_threads": float(r.num_threads),
            }
            for name, value in values.items():
                if value is not None:
                    summary.value.add(tag=f"{TAG_PREFIX}/{r.stage}/{name}", simple_value=float(value))
            text = summary.value.add(tag=f"{TAG_PREFIX}/{r.stage}/verdict_text")
            text.metadata.plugin_data.plugin_name = "text"  # TensorBoard's text dashboard shows it
            text.tensor.CopyFrom(tf.make_tensor_proto(r.line))
        self._writer.add_summary(summary, self._step)
        self._writer.flush()


def folded_reads(graph: tf.Graph) -> dict[str, str]:
    """stage -> the iterator read its fold added (passes/fold_dataset.py), for every folded stage of `graph`.

        before:  a graph whose stage "stage" was folded into its dataset (no StageDef left)
        after:   {"stage": "stage/dataset_fold/IteratorGetNext"}
    """
    found = {}
    for op in graph.get_operations():
        stage = folded_stage_of(op.name) if op.type == "IteratorGetNext" else None
        if stage is not None:
            found[stage] = op.name
    return found


def dataset_settings(graph: tf.Graph, stage: str) -> tuple[int, int]:
    """(the map's num_parallel_calls, the prefetch's buffer_size) of a folded stage's dataset ops, read from
    their constant inputs (-1: AUTOTUNE or not found).

        before:  staged(x, capacity=4, num_threads=2), folded
        after:   (2, 4)
    """
    parallelism = buffer_size = -1
    prefix = f"{stage}/{DATASET_FOLD_SCOPE}/"
    for op in graph.get_operations():
        if not op.name.startswith(prefix):
            continue
        if op.type in ("ParallelMapDatasetV2", "ParallelMapDataset") and op.inputs:
            parallelism = _constant(op.inputs[-1], parallelism)
        elif op.type == "PrefetchDataset" and len(op.inputs) > 1:
            buffer_size = _constant(op.inputs[1], buffer_size)
    return parallelism, buffer_size


def _constant(tensor: tf.Tensor, default: int) -> int:
    value = tf.get_static_value(tensor)
    return default if value is None else int(value)


def _with_line(report: PipelineReport) -> PipelineReport:
    return replace(report, line=_verdict_line(report))


def make_pipeline_hook(every_n_steps: int = 100, summary_dir: str | None = None, log: bool = True,
                       sample_every_n_steps: int = 5) -> PipelineHook:
    """A SessionRunHook that reports each stage's pipeline and says what limits the speed.

        before:  MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()])
        after:   MonitoredTrainingSession(hooks=[ss.make_prefetch_hook(), ss.make_pipeline_hook(100, logdir)])
                 # logs "stage 'stage' @ step 100: training-bound: the buffer stays full (3.9 of 4); ..."

    every_n_steps: steps per report; summary_dir: where TensorBoard scalars go (None: none);
    log: log the verdict line (INFO); sample_every_n_steps: one step in this many is traced to time the take.
    """
    return PipelineHook(every_n_steps, summary_dir, log, sample_every_n_steps)
