"""Sessions that optimize the graph when they are created: turn the flag on, keep the training loop.

This module: prepare_graph() and the plain ss.Session; ss.MonitoredTrainingSession is in monitored.py.

    config = ss.ConfigProto()                                   # or ss.enable_smart_stage(tf.compat.v1.ConfigProto())
    config.graph_options.optimizer_options.do_smart_stage = True
    with ss.MonitoredTrainingSession(config=config, hooks=[ss.make_prefetch_hook()]) as sess:
        while not sess.should_stop():
            sess.run(train_op)                                  # the same handles, a rewritten graph

Creating the session reads the flags (options_from_config); when they are on, it rewrites the
session's live tf.Graph in place, once per graph, before the first step (smartstage.session.live_rewrite).
Every handle the user holds keeps working because nothing is removed or renamed. Fetches (also a
hook's SessionRunArgs and a step_fn's runs) of a tensor that moved to the prefetch side are served
by the take output that carries it; anything else there raises TargetError naming the node.
The stock ConfigProto fields reach TensorFlow (session_config), with a prefetch inter-op pool added for a
session in this process (runtime/lanes/tuning/pools.py: AUTOTUNE may run the stages there); the SmartStage flags do not.

Prefetch threads:
- MonitoredTrainingSession: DeepRec's rule, the prefetch hook is required. A graph with stages and
  no `make_prefetch_hook()` among the hooks raises StageRuntimeError at creation, never a hang.
- Session: it owns the session's lifecycle, so it starts the prefetch threads itself on the first
  run() that reads a stage (after the user's init runs) and stops them in close(). An error of a
  prefetch thread is raised by run() as that error (not as the OutOfRangeError it causes).
  `prefetch=False` leaves the threads to the caller (smartstage.start_prefetch_threads).
  A run that re-initialises the iterator behind a stage (its initializer, or an init op that
  depends on it) empties that stage and refills it from the new iterator (smartstage.runtime.hooks.reinit).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable

import tensorflow as tf

from smartstage.config.options import SmartStageOptions, options_from_config, to_session_config
from smartstage.errors import SmartStageError
from smartstage.graph.eager import require_graph_mode
from smartstage.graph.op_types import ITERATOR_READS
from smartstage.session.fetches import FetchMapper
from smartstage.session.record import LiveRewrite, live_rewrite_of
from smartstage.session.live_rewrite import adopt_late_ops, rewrite_live_graph
from smartstage.runtime import stage_defs
from smartstage.runtime.door import lanes_stages, prepare_lanes, start_prefetch_threads, with_prefetch_pool
from smartstage.runtime.hooks.reinit import ReinitWatch, fetch_ops
from smartstage.runtime.stage.settings import STOP_JOIN_SECONDS

if TYPE_CHECKING:
    from smartstage.runtime.door import PrefetchThreads

logger = logging.getLogger(__name__)


def prepare_graph(graph: tf.Graph, options: SmartStageOptions, targets: Iterable[Any] | None = None
                  ) -> LiveRewrite | None:
    """Rewrites `graph` in place when `options` turn SmartStage on (once per graph); returns the record.

        before:  a staged graph; config with do_smart_stage
        after:   the same tf.Graph with preprocessing behind the stage; live_rewrite_of(graph) describes it

    With the flags off nothing moves, but a staged() stage whose prefetch side reads a tf.data iterator
    is folded into the iterator's dataset all the same (tf_data_stage="fold", the default): its own body,
    what the user put before staged(), becomes the dataset's map, so a restore is exact flag off too. The
    same passes run without expand_stage (one mechanism: passes/fold_dataset.py). A graph an earlier
    session rewrote stays rewritten, and its record is returned so fetches keep being mapped.

        before:  staged(parse(iterator.get_next()))                   flag off, tf_data_stage="fold"
        after:   iterator over dataset.map(parse).prefetch(capacity)  the step reads its IteratorGetNext
    """
    if options.enabled:
        return rewrite_live_graph(graph, options, targets or ())
    record = live_rewrite_of(graph)
    if record is None and options.tf_data_stage == "fold" and _reads_a_dataset(graph):
        try:
            return rewrite_live_graph(graph, replace(options, do_smart_stage=True, expand=False), targets or ())
        except SmartStageError as error:  # the flag is off: the stages run on lanes, as built, rather than fail
            logger.warning("SmartStage (flag off): the tf.data stages keep their lanes, not folded: %s", error)
    return record


def _reads_a_dataset(graph: tf.Graph) -> bool:
    """Whether a stage of `graph` has an iterator read on its prefetch side (the fold decides the rest)."""
    for stage_def in stage_defs(graph):
        try:
            put = graph.get_operation_by_name(stage_def.put_node)
        except KeyError:
            continue
        seen, todo = set(), [put]
        while todo:
            op = todo.pop()
            if op.type in ITERATOR_READS:
                return True
            for source in [t.op for t in op.inputs] + list(op.control_inputs):
                if source.name not in seen:
                    seen.add(source.name)
                    todo.append(source)
    return False


# -- plain Session --------------------------------------------------------------------------------


class _RawSession:
    """What the prefetch threads run through: the stock run(), without fetch mapping or error checks."""

    def __init__(self, session: "Session"):
        self._session = session

    @property
    def graph(self) -> tf.Graph:
        return self._session.graph

    @property
    def _config(self):
        return self._session._config  # noqa: SLF001

    @property
    def _closed(self) -> bool:
        return self._session._closed  # noqa: SLF001

    def run(self, *args, **kwargs):
        return tf.compat.v1.Session.run(self._session, *args, **kwargs)


def session_config(config, target="", graph: tf.Graph | None = None) -> "tf.compat.v1.ConfigProto":
    """The ConfigProto TensorFlow gets: `config`'s stock fields (to_session_config), and for a session in this
    process a prefetch inter-op pool that AUTOTUNE may give the stages on lanes (runtime/lanes/tuning/pools.py);
    none when `graph` (the session's, once prepared) has no stage left on lanes.

        before:  ss.ConfigProto(do_smart_stage=True)
        after:   ConfigProto(session_inter_op_thread_pool=[main pool, prefetch pool])
    """
    stock = to_session_config(config)
    if graph is not None and not lanes_stages(graph):
        return stock
    return with_prefetch_pool(stock, target)


class Session(tf.compat.v1.Session):
    """A tf.compat.v1.Session that optimizes its graph when created and runs the prefetch threads.

        before:  sess = tf.compat.v1.Session(config=config)
        after:   sess = ss.Session(config=config)   # config: ss.ConfigProto or a stock ConfigProto

    targets: tensors, ops or node names you will fetch, kept on the main side (besides the marked
      targets and the train_op / losses / summaries / update_ops collections).
    prefetch: start the prefetch threads on the first run() that reads a stage and stop them in
      close() (default); False: start them yourself with smartstage.start_prefetch_threads(sess).
    """

    def __init__(self, target: str = "", graph: tf.Graph | None = None, config=None, *,
                 targets: Iterable[Any] | None = None, prefetch: bool = True):
        if graph is None:
            require_graph_mode("smartstage.Session()", what="runs the default tf.compat.v1 graph (or pass graph=)")
        graph = graph if graph is not None else tf.compat.v1.get_default_graph()
        self._session = None  # BaseSession.__del__ reads it, also when the rewrite below raises
        self._auto_prefetch = prefetch
        self._prefetch_threads: PrefetchThreads | None = None
        self._closed_threads: PrefetchThreads | None = None
        self._prefetch_lock = threading.Lock()
        self._reaches_stage: dict[frozenset, bool] = {}
        self._error_raised = False
        self._reinit: ReinitWatch | None = None
        # The flags are parsed here, once; the typed options go down to the rewrite.
        self._smartstage = prepare_graph(graph, options_from_config(config), targets)
        if prefetch and lanes_stages(graph):  # a stage survived the passes unfolded: only then the lanes
            self._build_lanes(graph)
        self._mapper = FetchMapper(self._smartstage)
        super().__init__(target, graph=graph, config=session_config(config, target, graph))

    def _build_lanes(self, graph: tf.Graph) -> None:
        """Builds the lanes of the stages left unfolded (runtime/lanes/lanes.py; on input tasks:
        runtime/lanes/remote.py) before any run: they read the put's inputs on purpose, and built later (a queue
        runner's run racing the first step) adopt_late_ops would rewire them to the take."""
        record = self._smartstage
        version = graph.version
        prepare_lanes(graph, lanes_stages(graph))
        if record is not None and record.last_id >= version:
            record.last_id = graph.version
            record.last_op_id = max(graph._nodes_by_id, default=0)  # noqa: SLF001

    @property
    def smart_stage(self) -> LiveRewrite | None:
        """What SmartStage did to this session's graph (None: nothing)."""
        return self._smartstage

    @property
    def prefetch_threads(self) -> PrefetchThreads | None:
        """The prefetch threads this session started (None before the first step that reads a stage)."""
        return self._prefetch_threads

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        mapped = self._prepare(fetches, feed_dict)
        try:
            with self._reinitialising(mapped):
                return super().run(mapped, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
        except tf.errors.OpError as error:
            self._raise_prefetch_error(error)
            raise

    def make_callable(self, fetches, feed_list=None, accept_options=False):
        mapped = self._prepare(fetches, dict.fromkeys(feed_list or ()))
        call = super().make_callable(mapped, feed_list=feed_list, accept_options=accept_options)

        def run_callable(*args, **kwargs):
            self._prepare(mapped, None)
            try:
                with self._reinitialising(mapped):
                    return call(*args, **kwargs)
            except tf.errors.OpError as error:
                self._raise_prefetch_error(error)
                raise

        return run_callable

    def partial_run_setup(self, fetches, feeds=None):
        return super().partial_run_setup(self._prepare(fetches, dict.fromkeys(feeds or ())), feeds)

    def partial_run(self, handle, fetches, feed_dict=None):
        return super().partial_run(handle, self._prepare(fetches, feed_dict), feed_dict)

    def _reinitialising(self, fetches):
        """Around a run that re-initialises the iterator behind a stage: empties and refills the stage."""
        threads = self._prefetch_threads
        if threads is None:
            return contextlib.nullcontext()
        if self._reinit is None:
            self._reinit = ReinitWatch(self.graph, threads.stage_names)
        return self._reinit.around(threads, fetches)

    def _prepare(self, fetches, feed_dict):
        """Raises a recorded prefetch error, adopts late ops, maps fetches, checks feeds, starts prefetch."""
        threads = self._prefetch_threads
        if threads is not None and threads.error is not None:
            self._error_raised = True
            threads.raise_if_error()
        record = self._smartstage if self._smartstage is not None else live_rewrite_of(self.graph)
        if record is not None:
            if self._smartstage is None:
                self._smartstage, self._mapper = record, FetchMapper(record)
            if self.graph.version > record.last_id:
                adopt_late_ops(self.graph, record)
        mapped = self._mapper.map_fetches(fetches)
        self._mapper.check_feeds(feed_dict)
        if self._auto_prefetch and threads is None and not self._closed:
            self._maybe_start_prefetch(mapped)
        return mapped

    @property
    def starts_prefetch_threads(self) -> bool:
        """Whether this session starts the prefetch threads itself (prefetch=True, the default)."""
        return self._auto_prefetch

    def _maybe_start_prefetch(self, fetches) -> None:
        takes = {d.take_node for d in stage_defs(self.graph)}
        if not takes or not self._reads_a_stage(fetches, takes):
            return
        with self._prefetch_lock:
            if self._prefetch_threads is None:
                logger.info("SmartStage session: starting the prefetch threads of %s", sorted(takes))
                self._prefetch_threads = start_prefetch_threads(_RawSession(self))

    def _reads_a_stage(self, fetches, takes: set[str]) -> bool:
        ops = fetch_ops(fetches, self.graph)
        key = frozenset(op.name for op in ops)
        if key not in self._reaches_stage:
            seen: set[str] = set()
            stack = list(ops)
            found = False
            while stack and not found:
                op = stack.pop()
                if op.name in seen:
                    continue
                seen.add(op.name)
                found = op.name in takes
                stack.extend(t.op for t in op.inputs)
                stack.extend(op.control_inputs)
            self._reaches_stage[key] = found
        return self._reaches_stage[key]

    def _raise_prefetch_error(self, error: BaseException) -> None:
        threads = self._prefetch_threads
        if threads is not None and threads.error is not None and threads.error is not error:
            self._error_raised = True
            raise threads.error from error

    def close(self) -> None:
        threads, self._prefetch_threads = self._prefetch_threads, None
        self._closed_threads = threads
        if threads is not None:
            threads.request_stop()
        super().close()
        if threads is not None and not threads.join(STOP_JOIN_SECONDS):
            logger.warning("prefetch threads still running %.0f s after the session closed: %s",
                           STOP_JOIN_SECONDS, [t.name for t in threads.threads if t.is_alive()])

    def __exit__(self, exc_type, exc_value, exc_tb):
        super().__exit__(exc_type, exc_value, exc_tb)
        threads = self._closed_threads
        if exc_type is None and threads is not None and threads.error is not None and not self._error_raised:
            self._error_raised = True
            raise threads.error


__all__ = ["Session", "prepare_graph"]
