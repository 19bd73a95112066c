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
from typing import Iterable, Sequence

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.errors import StageRuntimeError
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.metadata import stage_defs

logger = logging.getLogger(__name__)

# Bounds on every wait of the runtime itself (seconds).
STOP_JOIN_SECONDS = 10.0
CONTROL_RUN_MILLIS = 30000  # close / cancel / ready runs never wait longer than this
WATCHDOG_POLL_SECONDS = 0.05


def _session_closed(sess) -> bool:
    return bool(getattr(sess, "_closed", False))


def _quiet_run(sess, fetch, what: str, timeout_millis: int = CONTROL_RUN_MILLIS) -> bool:
    """Runs a control op (close, cancel); a closed session or a closed buffer is not an error."""
    if _session_closed(sess):
        return False
    try:
        sess.run(fetch, options=config_pb2.RunOptions(timeout_in_ms=timeout_millis))
        return True
    except (tf.errors.OpError, RuntimeError) as error:
        logger.debug("%s did not run: %s", what, error)
        return False


class _PutState:
    """One prefetch thread's put in progress, for the timeout watchdog."""

    __slots__ = ("started", "warned")

    def __init__(self) -> None:
        self.started: float | None = None
        self.warned = 0


class _StageThreads:
    """The prefetch threads of one stage."""

    def __init__(self, owner: "PrefetchThreads", sess, stage_def: StageDef):
        self.owner = owner
        self.sess = sess
        self.stage_def = stage_def
        self.name = stage_def.name
        graph = sess.graph
        self.put = self._op(graph, "put_node", required=True)
        self.close = self._op(graph, "close_node")
        self.cancel = self._op(graph, "cancel_node")
        self.ready_put = self._op(graph, "ready_put_node")
        self.ready_size = self._consumer_of(graph, "ready_buffer_node", "QueueSizeV2")
        self.is_closed = self._consumer_of(graph, "buffer_node", "QueueIsClosedV2")
        self.placeholders = [self._tensor(graph, f.placeholder) for f in stage_def.feeds]
        self.feed_values = [self._tensor(graph, f.tensor) for f in stage_def.feeds]
        self.run_options = config_pb2.RunOptions()
        if stage_def.use_stage_subgraph_thread_pool:
            self.run_options.inter_op_thread_pool = stage_def.stage_subgraph_thread_pool_id
        self.timeout_seconds = max(stage_def.timeout_millis, 1) / 1000.0
        self.closed_codes = set(stage_def.closed_error_codes)
        self.ignored_codes = set(stage_def.ignored_error_codes)
        self.puts = [_PutState() for _ in range(max(stage_def.num_threads, 1))]
        self.threads: list[threading.Thread] = []
        self._closed_threads = 0
        self._lock = threading.Lock()

    def _missing(self, what: str) -> StageRuntimeError:
        return StageRuntimeError(
            f"stage '{self.name}': the session's graph has no {what}, which the stage description "
            "names; the graph was rewritten without keeping node names, or its StageDef is stale. "
            "Keep node names when rewriting, or update the StageDef in collection 'smartstage_stages'"
        )

    def _op(self, graph: tf.Graph, field: str, required: bool = False):
        name = getattr(self.stage_def, field)
        if not name:
            if required:
                raise self._missing(f"{field} (empty)")
            return None
        try:
            return graph.get_operation_by_name(name)
        except (KeyError, ValueError):
            raise self._missing(f"node '{name}' ({field})") from None

    def _tensor(self, graph: tf.Graph, name: str) -> tf.Tensor:
        try:
            return graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            raise self._missing(f"tensor '{name}' (a feed)") from None

    def _consumer_of(self, graph: tf.Graph, field: str, op_type: str):
        """The output of an `op_type` node reading the buffer named by `field`, if the graph has one."""
        if not getattr(self.stage_def, field):
            return None
        buffer = self._op(graph, field)
        found = [c for c in buffer.outputs[0].consumers() if c.type == op_type]
        return found[0].outputs[0] if found else None

    def check_thread_pool(self) -> None:
        if not self.stage_def.use_stage_subgraph_thread_pool:
            return
        pool_id = self.stage_def.stage_subgraph_thread_pool_id
        config = getattr(self.sess, "_config", None)
        pools = len(config.session_inter_op_thread_pool) if config is not None else 0
        if pool_id >= pools:
            raise StageRuntimeError(
                f"stage '{self.name}' runs its prefetch on inter-op thread pool {pool_id} "
                f"(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id={pool_id}), but the "
                f"session has {pools} session_inter_op_thread_pool entries. Create the session with a "
                f"ConfigProto listing at least {pool_id + 1} pools, e.g. "
                "tf.compat.v1.ConfigProto(session_inter_op_thread_pool=[config_pb2.ThreadPoolOptionProto("
                "num_threads=0), config_pb2.ThreadPoolOptionProto(num_threads=1)]) with config_pb2 from "
                "tensorflow.core.protobuf (pool 0 runs the training step, pool 1 the prefetch runs), "
                "or build the stage with use_stage_subgraph_thread_pool=False"
            )

    def check_open(self) -> None:
        options = config_pb2.RunOptions(timeout_in_ms=CONTROL_RUN_MILLIS)
        if self.is_closed is not None and self.sess.run(self.is_closed, options=options):
            raise StageRuntimeError(
                f"stage '{self.name}': its buffer is already closed in this session (a previous "
                "start was stopped, or an earlier session on the same tf.distribute.Server closed it: "
                "server resources outlive sessions). Create a new session, and for a remote target "
                "set ConfigProto(isolate_session_state=True) so every session gets fresh buffers"
            )

    def announce_ready(self) -> None:
        """Puts the token that lets the take's guard pass (once: the ready buffer holds one)."""
        if self.ready_put is None:
            return
        if self.ready_size is not None:
            size = self.sess.run(self.ready_size, options=config_pb2.RunOptions(timeout_in_ms=CONTROL_RUN_MILLIS))
            if size > 0:
                return
        try:
            self.sess.run(self.ready_put, options=config_pb2.RunOptions(timeout_in_ms=CONTROL_RUN_MILLIS))
        except tf.errors.DeadlineExceededError:
            # Someone else put the token between our size check and our put: ready either way.
            logger.debug("stage %s: ready token already present", self.name)

    def start(self) -> None:
        for index in range(len(self.puts)):
            thread = threading.Thread(
                target=self._loop, args=(index,), name=f"smartstage-prefetch-{self.name}-{index}", daemon=True
            )
            self.threads.append(thread)
        for thread in self.threads:
            thread.start()

    def _loop(self, index: int) -> None:
        put_state = self.puts[index]
        while not self.owner.stopping():
            try:
                feed = None
                if self.feed_values:
                    values = self.sess.run(self.feed_values, options=self.run_options)
                    feed = dict(zip(self.placeholders, values))
                put_state.started = time.monotonic()
                try:
                    self.sess.run(self.put, feed_dict=feed, options=self.run_options)
                finally:
                    put_state.started = None
                    put_state.warned = 0
            except Exception as error:  # noqa: BLE001  every outcome is classified below
                if not self._handle(error, index):
                    return
        logger.debug("prefetch thread %d of stage %s stopped", index, self.name)

    def _handle(self, error: Exception, index: int) -> bool:
        """What an error from a prefetch run means; True: the thread goes on."""
        code = getattr(error, "error_code", None)
        if self.owner.stopping() or _session_closed(self.sess):
            logger.debug("prefetch thread %d of stage %s ends on shutdown: %s", index, self.name, error)
            return False
        if code in self.closed_codes:
            logger.info("prefetch thread %d of stage %s reached the end of its input", index, self.name)
            self._thread_closed()
            return False
        if code in self.ignored_codes:
            logger.warning("stage %s: prefetch thread %d ignores an error and goes on: %s",
                           self.name, index, error)
            return True
        if isinstance(error, tf.errors.CancelledError):
            logger.info("stage %s: buffer closed or cancelled; prefetch thread %d ends", self.name, index)
            return False
        self.owner.report_error(self, error)
        return False

    def _thread_closed(self) -> None:
        with self._lock:
            self._closed_threads += 1
            last = self._closed_threads == len(self.puts)
        if last and self.close is not None:
            logger.info("stage %s: every prefetch thread reached the end of input; closing the buffer", self.name)
            _quiet_run(self.sess, self.close, f"close of stage {self.name}")

    def run_cancel(self) -> None:
        if self.cancel is not None:
            _quiet_run(self.sess, self.cancel, f"cancel of stage {self.name}")

    def check_timeouts(self, now: float) -> None:
        for index, put_state in enumerate(self.puts):
            started = put_state.started
            if started is None:
                continue
            waited = now - started
            if waited >= self.timeout_seconds * (put_state.warned + 1):
                put_state.warned += 1
                logger.warning(
                    "stage %s: the put of prefetch thread %d has waited %.1f s (timeout_millis=%d); "
                    "the buffer stays full because the main side takes no batch. The batch is kept and "
                    "the put keeps waiting.", self.name, index, waited, self.stage_def.timeout_millis,
                )


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
        self._stages = [_StageThreads(self, sess, stage_def) for stage_def in stages]
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

    def is_alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def stopping(self) -> bool:
        return self._stop_event.is_set() or (self.coord is not None and self.coord.should_stop())

    def start(self) -> "PrefetchThreads":
        if self._started:
            raise StageRuntimeError("these prefetch threads were already started; start new ones with start_prefetch_threads(sess)")
        for stage in self._stages:
            stage.check_thread_pool()
            stage.check_open()
        for stage in self._stages:
            stage.announce_ready()
        self._started = True
        for stage in self._stages:
            stage.start()
        if self._stages:
            self._watchdog = threading.Thread(target=self._watch, name="smartstage-prefetch-watchdog", daemon=True)
            self._watchdog.start()
        # The threads are not registered with the coordinator: its join() runs before the session
        # closes and would wait out its grace period for a put blocked on an input that nobody
        # fills anymore; closing the session cancels such a run instead.
        logger.info("started prefetch threads of stages %s", self.stage_names)
        return self

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

    def report_error(self, stage: _StageThreads, error: BaseException) -> None:
        """Records an unexpected prefetch error, stops everything and wakes a blocked main step."""
        with self._lock:
            first = self._error is None
            if first:
                if hasattr(error, "add_note"):
                    error.add_note(f"(raised by a SmartStage prefetch thread of stage '{stage.name}')")
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

    def raise_if_error(self) -> None:
        """Raises the recorded prefetch error (its own type and message), if any."""
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
    return PrefetchThreads(sess, chosen, coord).start()

