"""make_prefetch_hook(): the prefetch hook of any MonitoredSession, which folds tf.data stages in its begin().

    before:  staged(parse(iterator.get_next())) on lanes: our prefetch threads; a restore loses their buffers
    after:   tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()])
             begin() folds the stage: dataset.map(parse, deterministic=True).prefetch(capacity) -> iterator

A MonitoredSession calls every hook's begin() before it finalizes the graph and before any session has run
it: the moment a SmartStage session rewrites its graph. So begin() applies the fold a SmartStage session
applies with the flag off (session.prepare_graph: the passes without expand_stage, their edit log written into
the live graph, once per graph): each stage whose prefetch side reads one tf.data iterator, and that the fold
accepts, becomes its dataset's map and prefetch, and the iterator's saved state holds what tf.data buffered,
so a checkpoint restore trains every record once. The stages the fold refuses (its reason is logged) keep
their lanes, which the runtime's PrefetchHook builds and starts (runtime/hooks/prefetch_hook.py).

In a SmartStage session (ss.MonitoredTrainingSession, the smartstage.compat sessions) the session has
already decided from its flags (tf_data_stage="lanes" included), and begin() folds nothing more.

A stock session runs fetches as given. A fetch of what the fold took out of the step (an output of the old
take, a tensor of the folded body) cannot be served there: before_run raises TargetError naming it and the
fix, rather than letting the step fail on the stage's guard or read the changed iterator.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Iterable

import tensorflow as tf

from smartstage.config.options import TF_DATA_STAGES, SmartStageOptions
from smartstage.errors import ConfigError, TargetError
from smartstage.graph.eager import SESSION_HOOK, require_graph_mode
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime import PrefetchHook
from smartstage.session.fetches import FetchMapper
from smartstage.session.session import prepare_graph

logger = logging.getLogger(__name__)


class FoldingPrefetchHook(PrefetchHook):
    """The runtime's PrefetchHook, whose begin() first folds the graph's tf.data stages into their datasets.

        hook = FoldingPrefetchHook()            # make_prefetch_hook()
        hook.begin()                            # tf.data stages folded; the others' lanes built
        hook.after_create_session(sess, coord)  # threads for the stages left on lanes only (none if all folded)
    """

    def __init__(self, stages: Iterable[StageDef | str] | None = None, tf_data_stage: str = "fold"):
        if tf_data_stage not in TF_DATA_STAGES:
            raise ConfigError(f"make_prefetch_hook(tf_data_stage={tf_data_stage!r}): must be one of "
                              f"{list(TF_DATA_STAGES)}: 'fold' runs a tf.data stage in its dataset, 'lanes' on "
                              "SmartStage's prefetch threads")
        super().__init__(stages)
        self.tf_data_stage = tf_data_stage
        self._session_graph: weakref.ref | None = None
        self._mapper: FetchMapper | None = None

    def leave_to_session(self, graph: tf.Graph) -> None:
        """A SmartStage session prepares `graph` itself (from its flags): begin() then folds nothing in it."""
        self._session_graph = weakref.ref(graph)

    def begin(self) -> None:
        require_graph_mode("PrefetchHook.begin()", what=SESSION_HOOK)
        graph = tf.compat.v1.get_default_graph()
        self._mapper = None
        if self._session_graph is None or self._session_graph() is not graph:
            record = prepare_graph(graph, SmartStageOptions(tf_data_stage=self.tf_data_stage))
            if record is not None and record.stages:
                self._mapper = FetchMapper(record)  # a stock session: fetches the rewrite took away are refused
                folded = {stage.name for stage in record.stages if stage.folded_into}
                if self._stages is not None:  # a folded stage has no threads to start: its buffer left the step
                    self._stages = [s for s in self._stages if (s.name if isinstance(s, StageDef) else s) not in folded]
        super().begin()

    def before_run(self, run_context):
        if self._mapper is not None:
            _refuse_unserved(self._mapper, run_context.original_args)
        return super().before_run(run_context)


def _refuse_unserved(mapper: FetchMapper, args: Any) -> None:
    """TargetError for a fetch or feed of what a rewrite took out of the step: a stock session cannot map it."""
    mapper.check_feeds(args.feed_dict)
    mapped = mapper.map_fetches(args.fetches)  # raises TargetError for what no read of the step carries
    if mapped is args.fetches:
        return
    for old, new in zip(tf.nest.flatten(args.fetches, expand_composites=True),
                        tf.nest.flatten(mapped, expand_composites=True)):
        if old is not new:
            name = getattr(old, "name", old)
            stage = mapper.record.prefetch_nodes.get(str(name).rsplit(":", 1)[0], "")
            raise TargetError(
                f"cannot fetch {name!r} in a stock session: SmartStage took it out of the step of stage '{stage}', "
                f"which reads its batch from {getattr(new, 'name', new)!r} now; fetch a tensor built from it before "
                "the session is created (tf.identity), create the session with smartstage.MonitoredTrainingSession "
                "(it maps the fetch), or keep tf.data stages on lanes with make_prefetch_hook(tf_data_stage='lanes')")


def make_prefetch_hook(stages: Iterable[StageDef | str] | None = None, tf_data_stage: str = "fold"
                       ) -> FoldingPrefetchHook:
    """A SessionRunHook that folds the graph's tf.data stages into their datasets and runs the prefetch threads
    of the stages left on lanes (all stages by default; `stages` names the ones whose threads it runs).

        before:  MonitoredTrainingSession()                                   # a staged step fails
        after:   MonitoredTrainingSession(hooks=[smartstage.make_prefetch_hook()])

    tf_data_stage: "fold" (the default) or "lanes", which keeps every stage on SmartStage's prefetch threads.
    """
    return FoldingPrefetchHook(stages, tf_data_stage)


__all__ = ["FoldingPrefetchHook", "make_prefetch_hook"]
