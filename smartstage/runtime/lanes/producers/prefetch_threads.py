"""Prefetch threads: Python threads that run each stage's put op over and over.

    before:  sess.run(features)                          # fails: stage 'stage' has no prefetch threads
    after:   with ss.start_prefetch_threads(sess):
                 sess.run(features)                      # batches computed ahead by the threads

The threads read the stages from the session's graph (`stage_defs(sess.graph)`) and look every op
up by NAME, so a graph rewritten with names kept runs the same way. Rules, per stage:

- A closed-type error (default OutOfRangeError) ends a thread. When every thread of the stage ended
  that way, the buffer closes: the main side takes what is buffered, then gets OutOfRangeError.
- An ignored-type error is logged and the thread goes on.
- Any other error is recorded (`PrefetchThreads.error`), stops the coordinator with it, stops every
  prefetch thread and cancels the buffers, so a main step blocked on a take wakes up (with
  OutOfRangeError). `raise_if_error()`, leaving the `with` block, and the prefetch hook then raise
  the original error, type and message, so it never passes for an end of input.
- A put is never abandoned: when one waits longer than the stage's `timeout_millis` (a full buffer
  nobody takes from), a watchdog logs a warning and the put keeps waiting; no batch is dropped.
- `stop()` runs each stage's cancel op (wakes blocked puts and takes) and joins the threads with a
  bound. Closing the session also wakes them; they end without error.

Thread pools: a stage built with `use_stage_subgraph_thread_pool=True` runs its prefetch runs with
`RunOptions(inter_op_thread_pool=stage_subgraph_thread_pool_id)`, which selects
`ConfigProto.session_inter_op_thread_pool[stage_subgraph_thread_pool_id]` of the session. Once any
pool is configured, ordinary `sess.run` calls use pool 0; so configure two pools and give the stage
pool 1. Without the pool the threads refuse to start (StageRuntimeError naming the fix).
By default prefetch runs share the session's inter-op pool with the training step; see
docs/runtime.md for what was measured.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Iterable, Sequence

import tensorflow as tf

from smartstage.errors import StageRuntimeError
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.runtime.stage.settings import STOP_JOIN_SECONDS
from smartstage.runtime.lanes.saved_inputs import warn_saved_iterators
from smartstage.runtime.lanes.tuning.autotune import PipelineStats, TuningDecision
from smartstage.runtime.lanes.producers.stage_threads import StageThreads

logger = logging.getLogger(__name__)

# Bounds on the runtime's own waits (seconds).
WATCHDOG_POLL_SECONDS = 0.05

# The latest started prefetch threads of each graph, for observers such as the pipeline hook (weak:
# neither the graph nor the threads are kept alive by it).
_LATEST: "weakref.WeakKeyDictionary[tf.Graph, weakref.ref]" = weakref.WeakKeyDictionary()


def latest_prefetch_threads(graph: tf.Graph) -> "PrefetchThreads | None":
    """The prefetch threads most recently started for `graph`'s stages (None: none, or they stopped)."""
    ref = _LATEST.get(graph)
    threads = ref() if ref is not None else None
    return None if threads is None or threads.stopping() else threads


@dataclass(frozen=True)
class ExecutorBuilds:
    """What one stage's ordered producer built in this session (runtime/lanes/producers/callables.py; the runs of an
    unordered or sharded stage are not counted)."""

    stage: str
    builds: int          # fetch lists whose executors were built: callables made, run()'s first runs
    cpu_seconds: float   # thread CPU of the callables made (run()'s first runs are not timed)


class PrefetchThreads:
    """The running prefetch threads of a session's stages. Use it as a context manager.

        before:  threads = start_prefetch_threads(sess); ...; threads.stop()
        after:   with start_prefetch_threads(sess) as threads:   # stops them, raises their error
                     train(sess)
    """

    def __init__(self, sess, stages: Sequence[StageDef], coord: tf.train.Coordinator | None = None):
        self.sess = sess
        self.coord = coord
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._pending: tuple[StageThreads, BaseException] | None = None
        self._stages = [StageThreads(self, sess, stage_def) for stage_def in stages]
        self._watchdog: threading.Thread | None = None
        self._started = False

    @property
    def stage_names(self) -> list[str]:
        return [stage.name for stage in self._stages]

    @property
    def threads(self) -> list[threading.Thread]:
        """Every prefetch thread (the watchdog included)."""
        found = [t for stage in self._stages for t in stage.threads]
        return found + ([self._watchdog] if self._watchdog is not None else [])

    @property
    def error(self) -> BaseException | None:
        """The first unexpected error of a prefetch thread, or None."""
        return self._error

    def stats(self) -> list[PipelineStats]:
        """Each stage's pipeline now (occupancy, waits, settings in force, what autotune chose and why).

            before:  threads = start_prefetch_threads(sess)
            after:   threads.stats()[0].decision.num_threads   # e.g. 2, with .reason saying why
        """
        return [stage.stats() for stage in self._stages]

    def decisions(self) -> list[TuningDecision]:
        """What autotune chose for each stage, and why (settled or still measuring)."""
        return [stage.tuner.decision() for stage in self._stages]

    def executor_builds(self) -> list[ExecutorBuilds]:
        """Each stage's executor builds in this session so far (every session builds its own).

            before:  threads = start_prefetch_threads(sess); ... 20 steps
            after:   threads.executor_builds()   # [ExecutorBuilds('stage', builds=3, cpu_seconds=0.8)]
        """
        return [ExecutorBuilds(stage.name, stage.runs.builds, round(stage.runs.build_cpu_seconds, 3))
                for stage in self._stages]

    def step_timed(self, seconds: float) -> None:
        """Records one training step's time for every stage's stats (the prefetch hook calls this)."""
        for stage in self._stages:
            stage.meter.step_timed(seconds)

    def is_alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def stopping(self) -> bool:
        return self._stop_event.is_set() or (self.coord is not None and self.coord.should_stop())

    def start(self) -> "PrefetchThreads":
        if self._started:
            raise StageRuntimeError("these prefetch threads were already started; start new ones with start_prefetch_threads(sess)")
        for stage in self._stages:
            stage.prepare()  # the lanes: the one step that may add ops, before any thread runs
        for stage in self._stages:
            stage.check_thread_pool()
            stage.run_reset()  # a resettable stage starts empty: batches and marks of earlier initializer runs go
            stage.check_open()
        for stage in self._stages:
            stage.announce_ready()
        self._started = True
        _LATEST[self.sess.graph] = weakref.ref(self)
        for stage in self._stages:
            stage.start()
        self._start_watchdog()
        # The threads are not registered with the coordinator: its join() runs before the session
        # closes and would wait out its grace period for a put blocked on an input that nobody
        # fills anymore; closing the session cancels such a run instead.
        logger.info("started prefetch threads of stages %s", self.stage_names)
        return self

    def _start_watchdog(self) -> None:
        if self._stages and (self._watchdog is None or not self._watchdog.is_alive()):
            self._watchdog = threading.Thread(target=self._watch, name="smartstage-prefetch-watchdog", daemon=True)
            self._watchdog.start()

    def stage(self, name: str) -> StageThreads:
        for stage in self._stages:
            if stage.name == name:
                return stage
        raise StageRuntimeError(f"these prefetch threads run no stage named {name!r} (they run {self.stage_names})")

    def pause(self, names: Iterable[str], timeout: float = STOP_JOIN_SECONDS) -> list[str]:
        """Stops the threads of the named resettable stages only (their input is about to be re-initialised)
        and returns the names paused. StageRuntimeError when a thread does not end within `timeout`."""
        paused = []
        for name in names:
            stage = self.stage(name)
            if not stage.resettable:
                continue
            paused.append(name)
            if not stage.pause(timeout):
                raise StageRuntimeError(
                    f"stage '{name}': its prefetch threads did not stop within {timeout:.0f} s before its input "
                    "was re-initialised (a put waits on a slow input); the stage cannot be emptied safely")
        return paused

    def resume(self, names: Iterable[str]) -> None:
        """Empties the named paused stages and starts their threads again (the input was re-initialised)."""
        if self.stopping():
            return
        for name in names:
            self.stage(name).resume()
        self._start_watchdog()

    def _watch(self) -> None:
        while not self._stop_event.wait(WATCHDOG_POLL_SECONDS):
            if self.coord is not None and self.coord.should_stop():
                # The coordinator stops everything (an error, MonitoredSession closing): wake our puts.
                self._stop_event.set()
                self._cancel_all()
                return
            now = time.monotonic()
            for stage in self._stages:
                stage.check_timeouts(now)
            if not any(t.is_alive() for stage in self._stages for t in stage.threads):
                return

    def _cancel_all(self) -> None:
        for stage in self._stages:
            stage.run_cancel()

    def defer_error(self, stage: StageThreads, error: BaseException) -> None:
        """Records an error that arrives once the step has taken the good batches buffered before it
        (report_error follows); stop(), leaving the `with` block and the hook's end() raise it earlier."""
        with self._lock:
            if self._pending is None:
                self._pending = (stage, error)
        logger.info("stage %s: a prefetch run failed; the batches before it are delivered first: %s",
                    stage.name, error)

    def _promote_pending(self) -> None:
        with self._lock:
            if self._error is None and self._pending is not None:
                stage, error = self._pending
                _note(error, stage.name)
                self._error = error

    def report_error(self, stage: StageThreads, error: BaseException) -> None:
        """Records an unexpected prefetch error, stops everything and wakes a blocked main step."""
        with self._lock:
            first = self._error is None
            if first:
                _note(error, stage.name)
                self._error = error
        logger.error("stage %s: a prefetch run failed; stopping the prefetch threads: %s", stage.name, error)
        self._stop_event.set()
        if first and self.coord is not None:
            try:
                self.coord.request_stop((type(error), error, error.__traceback__))
            except Exception:  # noqa: BLE001
                # The coordinator was joined already (its session is closing): it re-raises instead
                # of recording. The error stays recorded here for raise_if_error().
                logger.debug("stage %s: the coordinator was already joined", stage.name)
        self._cancel_all()

    def raise_if_error(self, final: bool = False) -> None:
        """Raises the recorded prefetch error (its own type and message), if any.

        An error that waits behind good buffered batches is raised only once they were taken, or
        with `final=True` (the end of the session)."""
        if final:
            self._promote_pending()
        if self._error is not None:
            raise self._error

    def join(self, timeout: float | None = None) -> bool:
        """Waits until every prefetch thread has ended (end of input, stop, error); True if they have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        return not self.is_alive()

    def request_stop(self) -> None:
        """Asks every thread to stop and runs each stage's cancel op; does not wait for the threads.

        A put blocked on the stage's buffer wakes at once; one blocked upstream (on an input queue
        nobody fills) ends when that input closes or the session closes.
        """
        self._stop_event.set()
        self._cancel_all()

    def stop(self, timeout: float = STOP_JOIN_SECONDS) -> bool:
        """Stops the threads: runs each stage's cancel op, then joins them within `timeout` seconds.

        The buffers are closed afterwards: a later take gets OutOfRangeError. Returns True when
        every thread ended in time (a warning names the others).
        """
        self.request_stop()
        done = self.join(timeout)
        self._promote_pending()
        if not done:
            alive = [t.name for t in self.threads if t.is_alive()]
            logger.warning("prefetch threads still running %.0f s after stop: %s", timeout, alive)
        return done

    def __enter__(self) -> "PrefetchThreads":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop()
        if self._error is not None and exc is not self._error:
            if exc is None or isinstance(exc, tf.errors.OpError):
                # OutOfRange / Cancelled from a take are what the prefetch error caused.
                raise self._error from exc
            logger.error("a prefetch thread failed too: %s", self._error)
        return False


def _note(error: BaseException, stage: str) -> None:
    text = f"(raised by a SmartStage prefetch thread of stage '{stage}')"
    if hasattr(error, "add_note") and text not in getattr(error, "__notes__", []):
        error.add_note(text)


def _is_monitored_session(sess) -> bool:
    return hasattr(sess, "_tf_sess") and hasattr(sess, "should_stop")


def start_prefetch_threads(
    sess,
    coord: tf.train.Coordinator | None = None,
    stages: Iterable[StageDef | str] | None = None,
) -> PrefetchThreads:
    """Starts the prefetch threads of the stages in `sess.graph` (or of `stages`, by def or name).

    `sess` is a plain `tf.compat.v1.Session`; with a MonitoredTrainingSession use
    `make_prefetch_hook()` instead. With `coord`, an unexpected error stops the coordinator, and
    the coordinator stopping stops the threads.

        before:  sess.run(features)   # InvalidArgumentError: stage 'stage' has no prefetch threads
        after:   with start_prefetch_threads(sess): sess.run(features)
    """
    if _is_monitored_session(sess):
        raise StageRuntimeError(
            "start_prefetch_threads() needs a plain tf.compat.v1.Session; for a MonitoredSession "
            "pass hooks=[smartstage.make_prefetch_hook()] when you create it"
        )
    if getattr(sess, "starts_prefetch_threads", False):
        raise StageRuntimeError(
            "start_prefetch_threads(): this smartstage.Session starts the prefetch threads itself on its "
            "first step, and a second set would run two producers per stage (batches out of order); "
            "drop this call, or create the session with smartstage.Session(..., prefetch=False)"
        )
    known = stage_defs(sess.graph)
    if stages is None:
        chosen = known
    else:
        by_name = {s.name: s for s in known}
        chosen = []
        for item in stages:
            if isinstance(item, StageDef):
                chosen.append(item)
            elif item in by_name:
                chosen.append(by_name[item])
            else:
                raise StageRuntimeError(
                    f"start_prefetch_threads(): the session's graph has no stage named {item!r} "
                    f"(it has {sorted(by_name)}); pass one of those names or a StageDef"
                )
    if not chosen:
        logger.info("start_prefetch_threads(): the session's graph has no stage; nothing to start")
    warn_saved_iterators(sess.graph, chosen)
    return PrefetchThreads(sess, chosen, coord).start()

