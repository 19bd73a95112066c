"""`make_prefetch_hook()`: starts and stops the prefetch threads with a MonitoredTrainingSession.

    before:  with tf.compat.v1.train.MonitoredTrainingSession() as sess: ...   # stage never filled
    after:   with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:

How a prefetch error reaches the user through a stock MonitoredTrainingSession: the failing
prefetch thread stops the session's coordinator with the error and cancels the buffer, so a step
blocked on the take wakes up with OutOfRangeError. `_CoordinatedSession.run` re-raises that
original OutOfRangeError, and `MonitoredSession.__exit__` swallows OutOfRangeError as a normal end
of input before it calls every hook's `end()`. So this hook raises the recorded error from
`before_run` of the next step and from `end()`, and `should_stop()` raises it through the
coordinator: the user sees the error's own type and message, never a quiet end of input.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterable

import tensorflow as tf

from smartstage.graph.eager import SESSION_HOOK, require_graph_mode
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.runtime.hooks.reinit import ReinitWatch
from smartstage.runtime.door import lanes_stages, prepare_lanes, start_prefetch_threads

if TYPE_CHECKING:
    from smartstage.runtime.door import PrefetchThreads

logger = logging.getLogger(__name__)

END_JOIN_SECONDS = 2.0


class PrefetchHook(tf.compat.v1.train.SessionRunHook):
    """Runs the prefetch threads of every stage in the session's graph while the session lives.

    A MonitoredTrainingSession that re-creates its session (after an AbortedError, say) calls
    `after_create_session` again: the hook stops the old threads and starts new ones.

    A run that re-initialises the iterator behind a stage (its initializer, or an op that depends on
    it) stops that stage's threads before the run and empties and refills the stage after it
    (smartstage.runtime.hooks.reinit).

    A stage folded into its dataset has left the graph: the hook starts nothing for it, so a script keeps its
    hooks whichever way its stages run. This hook folds nothing itself (the runtime never rewrites a graph):
    smartstage.make_prefetch_hook() (session/prefetch_hook.py) is this hook with a begin() that folds the
    tf.data stages first.
    """

    def __init__(self, stages: Iterable[StageDef | str] | None = None):
        self._stages = None if stages is None else list(stages)
        self._threads: PrefetchThreads | None = None
        self._reinit: ReinitWatch | None = None
        self._paused: list[str] = []
        self._step_started: float | None = None

    @property
    def threads(self) -> PrefetchThreads | None:
        """The prefetch threads of the current session (None before the session exists)."""
        return self._threads

    def begin(self) -> None:
        # Made anywhere (an eager program may build its v1 graph inside `with graph.as_default():`), but begun
        # only in a graph: a session begun eagerly would find no stage and prefetch nothing.
        require_graph_mode("PrefetchHook.begin()", what=SESSION_HOOK)
        # MonitoredTrainingSession finalizes the graph right after begin(): the ordered lanes of stages
        # with several threads, and those of stages placed on input tasks, are built now, from the puts as they are.
        graph = tf.compat.v1.get_default_graph()
        names = None if self._stages is None else {s.name if isinstance(s, StageDef) else s for s in self._stages}
        prepare_lanes(graph, [d for d in stage_defs(graph) if names is None or d.name in names])

    def after_create_session(self, session, coord) -> None:
        self._stop_threads()
        if self._stages is None and not lanes_stages(session.graph):
            return  # every stage folded into its dataset: no thread to start (the lanes stay unimported)
        self._threads = start_prefetch_threads(session, coord=coord, stages=self._stages)
        self._reinit = ReinitWatch(session.graph, self._threads.stage_names)

    def before_run(self, run_context):
        if self._threads is not None:
            self._threads.raise_if_error()
            if self._reinit is not None and self._reinit.active:
                self._paused = self._reinit.pause_for(self._threads, run_context.original_args.fetches)
        self._step_started = time.monotonic()
        return None

    def after_run(self, run_context, run_values) -> None:
        paused, self._paused = self._paused, []
        ReinitWatch.resume(self._threads, paused)
        if self._threads is not None and self._step_started is not None:
            self._threads.step_timed(time.monotonic() - self._step_started)

    def end(self, session) -> None:
        threads, self._threads = self._threads, None
        if threads is None:
            return
        # The session closes right after end(): a thread still waiting on its input then ends too,
        # so a short bound here keeps a normal exit quick.
        threads.request_stop()
        if not threads.join(END_JOIN_SECONDS):
            logger.info("prefetch threads %s still wait on their input; they end when the session closes",
                        [t.name for t in threads.threads if t.is_alive()])
        threads.raise_if_error(final=True)

    def _stop_threads(self) -> None:
        if self._threads is not None:
            self._threads.stop()
            self._threads = None


def make_prefetch_hook(stages: Iterable[StageDef | str] | None = None) -> PrefetchHook:
    """A SessionRunHook that starts the prefetch threads of the session's stages (all by default), every stage
    on lanes; smartstage.make_prefetch_hook() folds the tf.data stages into their datasets first.

        before:  MonitoredTrainingSession()                                   # a staged step fails
        after:   MonitoredTrainingSession(hooks=[smartstage.runtime.make_prefetch_hook()])
    """
    return PrefetchHook(stages)
