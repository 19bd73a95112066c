"""One stage at run time: its op handles, what each error means, its lifecycle and the timeout watchdog.

    before:  a stage's put op, never run
    after:   stage = StageThreads(owner, sess, stage_def); stage.prepare(); stage.start()   # fills the buffer

`prepare()` is the one step that may add ops (the lanes, when the graph is not finalized); the constructor
only looks up the stage's ops by name. `start()` hands the stage, as a ProducerHost (host.py), to one of
three producers: OrderedProducer (ordered.py: the put on one lane, or ordered lanes, runtime/lanes/lanes.py),
the default at every lane count, tuned by runtime/lanes/tuning/autotune.py when lanes / capacity are AUTOTUNE;
ShardedProducer (sharded.py) for a stage sharded over input tasks; UnorderedProducer (unordered.py) for a
stage built with `deterministic=False` (StageDef.unordered).

`PrefetchThreads` (prefetch_threads.py) owns one of these per stage and decides for all of them: when to
stop, and what to do with an unexpected error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Iterator

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.errors import StageRuntimeError
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.lanes.lanes import LaneGraph, lane_count, lane_graph
from smartstage.runtime.lanes.remote import named_task_error, remote_lane_graph, remote_plan
from smartstage.runtime.lanes.producers.callables import ProducerRuns
from smartstage.runtime.lanes.producers.control import CONTROL_RUN_MILLIS, quiet_run, session_closed
from smartstage.runtime.lanes.producers.host import Owner
from smartstage.runtime.lanes.producers.ordered import OrderedProducer
from smartstage.runtime.lanes.producers.sharded import ShardedProducer
from smartstage.runtime.lanes.producers.unordered import UnorderedProducer
from smartstage.runtime.stage.settings import StageSettings
from smartstage.runtime.lanes.tuning.autotune import PipelineStats, Tuner
from smartstage.runtime.lanes.tuning.meter import StageMeter
from smartstage.runtime.lanes.tuning.pools import check_stage_pool, explicit_pool_threads, stage_pools

logger = logging.getLogger(__name__)

_UNINITIALIZED = "iterator has not been initialized"  # IteratorGetNext's FailedPrecondition message
DRAIN_POLL_SECONDS = 0.002  # how often a deferred error looks whether the good batches were taken


class _PutState:
    """One prefetch thread's put in progress, for the timeout watchdog."""

    __slots__ = ("started", "warned")

    def __init__(self) -> None:
        self.started: float | None = None
        self.warned = 0


class StageThreads:
    """The prefetch threads of one stage: a ProducerHost (host.py) for the producer that runs them."""

    def __init__(self, owner: Owner, sess, stage_def: StageDef):
        self.owner = owner
        self.sess = sess
        self.stage_def = stage_def
        self.settings = StageSettings.from_def(stage_def)
        self.name = stage_def.name
        graph = sess.graph
        self.put = self._op(graph, "put_node", required=True)
        self.close = self._op(graph, "close_node")
        self.cancel = self._op(graph, "cancel_node")
        self.ready_put = self._op(graph, "ready_put_node")
        self.ready_size = self._consumer_of(graph, "ready_buffer_node", "QueueSizeV2")
        self.is_closed = self._consumer_of(graph, "buffer_node", "QueueIsClosedV2")
        # Stages at an initializable iterator (auto-stage): emptied and refilled when it is re-initialised.
        self.reset = self._op(graph, "reset_node")
        self.stale_mark = self._op(graph, "stale_mark_node")
        self.placeholders = [self._tensor(graph, f.placeholder) for f in stage_def.feeds]
        self.feed_values = [self._tensor(graph, f.tensor) for f in stage_def.feeds]
        self.timeout_seconds = max(stage_def.timeout_millis, 1) / 1000.0
        self.closed_codes = set(stage_def.closed_error_codes)
        self.ignored_codes = set(stage_def.ignored_error_codes)
        size_op = self._op(graph, "size_node")
        self.size = size_op.outputs[0] if size_op is not None else None
        self.ordered = self.settings.ordered
        self.remote = remote_plan(graph, self.name) if self.ordered else None  # on input tasks (remote.py)
        self._options, self.tuner = self._pools_and_tuner()
        self._remote_options = self.remote.run_options(self.run_options) if self.remote is not None else None
        self.meter = StageMeter()
        self.lanes: LaneGraph | None = None
        self.producer: OrderedProducer | ShardedProducer | UnorderedProducer | None = None
        # the ordered producer's callables: executors belong to the session, so a producer started again
        # after a re-initialisation (resume) runs the ones its predecessor built
        self.runs = ProducerRuns(sess, enabled=self.remote is None)
        self.puts: list[_PutState] = []  # one per thread that runs a put or a move, for the timeout watchdog
        self.prepared = False
        self._lock = threading.Lock()
        self._paused = threading.Event()  # this stage alone stops (re-initialisation), the others go on
        self.waits_for_initializer = False

    def prepare(self) -> None:
        """Finds or builds the stage's lane ops (adds ops when the graph is not finalized), before any thread.

            before:  an ordered stage with num_threads=4, its put only
            after:   stage/lanes/lane_<0..3>/... in the graph, self.lanes set; the watchdog's put slots sized
        """
        if self.prepared:
            return
        graph = self.sess.graph
        if self.ordered:
            count = lane_count(self.settings)
            if self.remote is not None:
                self.lanes = remote_lane_graph(graph, self.remote, self.put, self.put.inputs[0])
            elif count:
                self.lanes, why = lane_graph(graph, self.name, self.put, self.put.inputs[0], count)
                if self.lanes is None:
                    logger.warning("stage %s: runs one ordered prefetch thread instead of %s: %s", self.name,
                                   "AUTOTUNE" if self.settings.tune_num_threads else self.settings.num_threads, why)
            workers = len(self.lanes.lanes) if self.lanes is not None else 1
            self.puts = [_PutState() for _ in range(workers + 1)]  # the workers and the merger
        else:
            self.puts = [_PutState() for _ in range(self.settings.num_threads)]
        self.prepared = True

    @property
    def resettable(self) -> bool:
        return self.reset is not None

    @property
    def threads(self) -> list[threading.Thread]:
        return self.producer.threads if self.producer is not None else []

    @property
    def run_options(self) -> config_pb2.RunOptions:
        """The options of this stage's prefetch runs: the pool in force (the tuner may switch it between batches)."""
        return self._options[self.tuner.own_pool]

    @property
    def body_run_options(self) -> config_pb2.RunOptions:
        return self._remote_options if self._remote_options is not None else self.run_options

    def _pools_and_tuner(self) -> tuple[dict[bool, config_pb2.RunOptions], Tuner]:
        """The run options per pool (runtime/lanes/tuning/pools.py) and the tuner of lanes, capacity and pool."""
        settings = self.settings
        config = getattr(self.sess, "_config", None)
        options, tune_pool, note = stage_pools(settings, config, self.remote is not None)
        pinned = explicit_pool_threads(settings, config)
        max_threads = lane_count(settings) or 1
        tuner = Tuner(self.name, settings.num_threads, settings.capacity, settings.tune_num_threads,
                      settings.tune_capacity,
                      max_threads=min(max_threads, pinned) if pinned and settings.tune_num_threads else max_threads,
                      max_buffered_bytes=settings.max_buffered_bytes, own_pool=settings.pool is not None,
                      tune_pool=tune_pool, pool_note=note)
        return options, tuner

    def stats(self) -> PipelineStats:
        """The stage's pipeline now: last window's measurements, the settings in force, the decision."""
        producer = self.producer
        num_threads = producer.num_threads if producer is not None else self.settings.num_threads
        capacity = (producer.soft_capacity if producer is not None and producer.soft_capacity is not None
                    else self.tuner.capacity)
        lane_batches = tuple(producer.lane_batches) if producer is not None else ()
        return PipelineStats(stage=self.name, num_threads=num_threads, capacity=capacity, own_pool=self.tuner.own_pool,
                             ordered=self.ordered, lane_batches=lane_batches, decision=self.tuner.decision(),
                             **self.meter.summary())

    def stopping(self) -> bool:
        return self.owner.stopping()

    def paused(self) -> bool:
        return self._paused.is_set()

    def halted(self) -> bool:
        """Whether this stage's threads must stop making batches: shutdown, a pause, or a closed session."""
        return self.owner.stopping() or self._paused.is_set() or session_closed(self.sess)

    def control_run(self, fetch):
        return self.sess.run(fetch, options=config_pb2.RunOptions(timeout_in_ms=CONTROL_RUN_MILLIS))

    def feed_dict(self) -> dict | None:
        """The stage's feeds for one batch: its value tensors, evaluated now."""
        if not self.feed_values:
            return None
        values = self.sess.run(self.feed_values, options=self.run_options)
        return dict(zip(self.placeholders, values))

    @contextlib.contextmanager
    def in_flight(self, index: int | None) -> Iterator[None]:
        """Marks a run that may wait on a full buffer, for the timeout watchdog (index None: not watched)."""
        if index is None:
            yield
            return
        put_state = self.puts[index]
        put_state.started = time.monotonic()
        try:
            yield
        finally:
            put_state.started = None
            put_state.warned = 0

    def classify(self, error: BaseException) -> str:
        """What a prefetch error means: shutdown, closed (end of input), ignored, cancelled, uninitialized
        (an iterator not initialised yet, at a resettable stage) or unexpected."""
        code = getattr(error, "error_code", None)
        if self.halted():
            return "shutdown"
        if code in self.closed_codes:
            return "closed"
        if code in self.ignored_codes:
            return "ignored"
        if isinstance(error, tf.errors.CancelledError):
            return "cancelled"
        if self.resettable and isinstance(error, tf.errors.FailedPreconditionError) and _UNINITIALIZED in str(error):
            return "uninitialized"
        return "unexpected"

    def finish(self, error: BaseException, deferred: bool) -> None:
        """The ordered producer stops at `error`, every earlier batch being in the buffer already."""
        kind = self.classify(error)
        if kind == "closed":
            logger.info("stage %s: end of input; closing the buffer", self.name)
            self.close_buffer()
        elif kind == "uninitialized":
            self.wait_for_initializer(0)
        elif kind == "unexpected":
            if deferred:
                self.fail_in_order(error)
            else:
                self.owner.report_error(self, error)
        else:
            logger.debug("stage %s: the producer ends (%s): %s", self.name, kind, error)

    def fail_in_order(self, error: BaseException) -> None:
        """An unexpected error after the good batches: waits until the step has taken every batch buffered
        before it, then reports it (stop, cancel: a step waiting on the empty buffer wakes), so it arrives
        after the last good batch, as itself, and never as an end of input."""
        self.owner.defer_error(self, error)
        while self.size is not None and not self.owner.stopping() and not session_closed(self.sess):
            try:
                if int(self.sess.run(self.size)) == 0:
                    break
            except (tf.errors.OpError, RuntimeError):
                break
            time.sleep(DRAIN_POLL_SECONDS)
        self.owner.report_error(self, error)

    def close_buffer(self, why: str = "") -> None:
        """Closes the stage's buffer (end of input): the step takes what is buffered, then OutOfRangeError."""
        if self.close is None:
            return
        if why:
            logger.info("stage %s: %s; closing the buffer", self.name, why)
        quiet_run(self.sess, self.close, f"close of stage {self.name}")

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
        # Lane ops read the buffer too; theirs wait for a move (control input): never pick them.
        found = [c for c in buffer.outputs[0].consumers() if c.type == op_type and not c.control_inputs]
        return found[0].outputs[0] if found else None

    def check_thread_pool(self) -> None:
        check_stage_pool(self.settings, getattr(self.sess, "_config", None))

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

    def run_reset(self) -> None:
        """Empties a resettable stage: a fresh, open buffer and no stale marks (its threads must not run)."""
        if self.reset is not None:
            self.sess.run(self.reset, options=config_pb2.RunOptions(timeout_in_ms=CONTROL_RUN_MILLIS))
            self.waits_for_initializer = False

    def pause(self, timeout: float) -> bool:
        """Stops this stage's threads (cancels its buffer, so a blocked put wakes); True when all ended."""
        self._paused.set()
        self.run_cancel()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def resume(self) -> None:
        """Empties the stage and starts new threads (after pause(), once the input was re-initialised)."""
        self.run_reset()
        self._paused.clear()
        self.puts = [_PutState() for _ in self.puts]
        if self.producer is not None:
            self.producer.discard_lane_leftovers()
        self.check_open()
        self.announce_ready()
        self.start()

    def lane_error(self, error: BaseException, lane: int) -> BaseException:
        return error if self.remote is None else named_task_error(error, self.remote, lane)  # InputTaskError

    def start(self) -> None:
        """Starts the stage's producer (prepare() ran: the lanes exist)."""
        if not self.prepared:
            raise StageRuntimeError(f"stage '{self.name}': start() before prepare(); call prepare() first, "
                                    "while the graph may still grow (PrefetchThreads.start() does)")
        if self.remote is not None and self.remote.mode == "sharded":
            self.producer = ShardedProducer(self, self.lanes, self.remote)
            self.producer.start()
        elif self.ordered:
            self.producer = OrderedProducer(self, self.lanes, self.runs)
            self.producer.start(prime=self.resettable)
        else:
            self.producer = UnorderedProducer(self, self.settings.num_threads)
            self.producer.start(prime=self.resettable)

    def wait_for_initializer(self, index: int) -> None:
        """The iterator is not initialised yet (an eval iterator, say): the thread ends quietly, and a
        stale mark makes a step that takes from the stage fail at once, naming the fix, instead of
        waiting for a batch. Running the initializer through the runtime restarts the threads."""
        logger.info("stage %s: prefetch thread %d waits for the iterator's initializer %s", self.name, index,
                    list(self.stage_def.reset_trigger_nodes))
        with self._lock:
            first = not self.waits_for_initializer
            self.waits_for_initializer = True
        if first and self.stale_mark is not None:
            quiet_run(self.sess, self.stale_mark, f"stale mark of stage {self.name}")

    def run_cancel(self) -> None:
        if self.cancel is not None:
            quiet_run(self.sess, self.cancel, f"cancel of stage {self.name}")

    def check_timeouts(self, now: float) -> None:
        for index, put_state in enumerate(self.puts):
            started = put_state.started
            if started is None:
                continue
            waited = now - started
            if waited >= self.timeout_seconds * (put_state.warned + 1):
                put_state.warned += 1
                logger.warning(
                    "stage %s: the put of prefetch thread %d has waited %.1f s (timeout_millis=%d): "
                    "the buffer is full because no step takes from it, or the put's input is slow. "
                    "The batch is kept and the put keeps waiting.",
                    self.name, index, waited, self.stage_def.timeout_millis,
                )
