"""Re-initialising an iterator behind a stage: empty the stage, then refill it from the new iterator.

    before:  sess.run(iterator.initializer)        # a new epoch, or train -> eval data
             sess.run(train_op)                    # would train on batches buffered before the initializer
    after:   the same two lines: the stage is emptied while the initializer runs, and refilled after it

A stage auto-stage put at an initializable iterator names the iterator's initializers (MakeIterator)
in its StageDef (`reset_trigger_nodes`). Whoever runs the session's steps must see a run that would
run one of them (the initializer itself, or an op that depends on it, such as an init group):

    1. before the run: stop that stage's prefetch threads (its buffer is cancelled, so a put that waits
       wakes up; the other stages go on);
    2. the run: the initializer resets the iterator (and leaves a stale mark, see below);
    3. after the run: empty the stage (a fresh buffer, no stale marks) and start its threads again.

Who sees the runs:
- `make_prefetch_hook()` in a MonitoredTrainingSession: `before_run` / `after_run` of every run;
- `smartstage.Session`: its own `run()`;
- a plain `tf.compat.v1.Session`: nobody, so run initializers with `run_initializer(sess, threads, op)`.

If an initializer runs where nobody sees it, the stage is not emptied; but every initializer run also
enqueues a stale mark (a control input the auto-stage pass adds to MakeIterator), and the take runs
only when there is none: that step fails at once with an InvalidArgumentError saying this, instead of
training on stale batches. A stage whose iterator is not initialised yet (an eval iterator at the start)
lets its prefetch threads end quietly, with a mark: taking from it fails the same way until an
initializer runs through the runtime.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import tensorflow as tf

from smartstage.runtime.stage.metadata import stage_defs

if TYPE_CHECKING:
    from smartstage.runtime.door import PrefetchThreads

logger = logging.getLogger(__name__)


def fetch_ops(fetches: Any, graph: tf.Graph) -> list[tf.Operation]:
    """The operations a run's fetches name (tensors, ops, names, nested structures)."""
    ops = []
    for leaf in tf.nest.flatten(fetches, expand_composites=True):
        if isinstance(leaf, str):
            try:
                leaf = graph.as_graph_element(leaf)
            except (KeyError, ValueError, TypeError):
                continue  # the run itself raises its own error for a bad name
        if isinstance(leaf, tf.Operation):
            ops.append(leaf)
        elif isinstance(getattr(leaf, "op", None), tf.Operation):
            ops.append(leaf.op)
    return ops


class ReinitWatch:
    """Which stages a run re-initialises: the stages whose initializers a fetched op is, or depends on.

        watch = ReinitWatch(graph)
        watch.stages_reset_by([init_op])          # ["smart_stage"]: init_op groups the iterator's initializer

    Built once per graph: every op downstream of an initializer (usually the initializer and an init
    group or two) maps to the stages it resets, so a run costs a few dict lookups. Ops added to the
    graph later are taken into account (the map is rebuilt when the graph version changes).
    """

    def __init__(self, graph: tf.Graph, stages: Iterable[str] | None = None):
        self.graph = graph
        self._only = None if stages is None else set(stages)
        self._version = -1
        self._resets: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        self._refresh()
        return bool(self._resets)

    def _refresh(self) -> None:
        with self._lock:
            if self.graph.version == self._version:
                return
            resets: dict[str, list[str]] = {}
            for stage_def in stage_defs(self.graph):
                if self._only is not None and stage_def.name not in self._only:
                    continue
                todo = []
                for name in stage_def.reset_trigger_nodes:
                    try:
                        todo.append(self.graph.get_operation_by_name(name))
                    except KeyError:
                        logger.warning("stage %s: its initializer %r is not in the graph", stage_def.name, name)
                seen: set[str] = set()
                while todo:
                    op = todo.pop()
                    if op.name in seen:
                        continue
                    seen.add(op.name)
                    resets.setdefault(op.name, []).append(stage_def.name)
                    todo.extend(c for out in op.outputs for c in out.consumers())
                    todo.extend(op._control_outputs)  # noqa: SLF001  (no public accessor)
            self._resets = {k: tuple(dict.fromkeys(v)) for k, v in resets.items()}
            self._version = self.graph.version

    def stages_reset_by(self, fetches: Any) -> list[str]:
        """The stages a run of `fetches` re-initialises, in stage order."""
        self._refresh()
        if not self._resets:
            return []
        found: dict[str, None] = {}
        for op in fetch_ops(fetches, self.graph):
            for stage in self._resets.get(op.name, ()):
                found[stage] = None
        return list(found)

    def pause_for(self, threads: PrefetchThreads | None, fetches: Any) -> list[str]:
        """Before a run: stops the prefetch threads of the stages it re-initialises; returns their names."""
        if threads is None:
            return []
        names = [n for n in self.stages_reset_by(fetches) if n in threads.stage_names]
        if not names:
            return []
        logger.info("stages %s: their iterator is re-initialised; emptying them", names)
        return threads.pause(names)

    @staticmethod
    def resume(threads: PrefetchThreads | None, names: list[str]) -> None:
        """After the run: empties the paused stages and starts their threads again."""
        if threads is not None and names:
            threads.resume(names)

    @contextlib.contextmanager
    def around(self, threads: PrefetchThreads | None, fetches: Any) -> Iterator[list[str]]:
        """Pauses the stages a run of `fetches` re-initialises, and resumes them after it (also on error)."""
        names = self.pause_for(threads, fetches)
        try:
            yield names
        finally:
            self.resume(threads, names)


def run_initializer(sess, threads: PrefetchThreads, fetches: Any, feed_dict=None, **kwargs) -> Any:
    """`sess.run(fetches, feed_dict)` for a plain Session whose prefetch threads you started: stages whose
    iterator `fetches` re-initialises are emptied and refilled from the new iterator.

        before:  sess.run(iterator.initializer)                                # stale batches: the next step fails
        after:   ss.runtime.run_initializer(sess, threads, iterator.initializer)
    """
    watch = ReinitWatch(sess.graph)
    with watch.around(threads, fetches):
        return sess.run(fetches, feed_dict=feed_dict, **kwargs)
