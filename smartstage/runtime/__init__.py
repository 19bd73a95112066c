"""The staging runtime on stock TensorFlow (graph mode, tf.compat.v1).

    features = staged(parse(batch), capacity=4, num_threads=2)      # a stage boundary in the graph
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[make_prefetch_hook()]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

See docs/runtime.md.
"""

from smartstage.runtime.stage.settings import AUTOTUNE
from smartstage.runtime.tuning.autotune import PipelineStats, TuningDecision
from smartstage.runtime.hooks.prefetch_hook import PrefetchHook, make_prefetch_hook
from smartstage.runtime.stage.metadata import (
    STAGES_COLLECTION,
    TARGETS_COLLECTION,
    StageRecord,
    add_stage_def,
    stage_defs,
    stage_defs_from_meta_graph,
)
from smartstage.runtime.hooks.pipeline_hook import PipelineHook, PipelineReport, make_pipeline_hook
from smartstage.runtime.hooks.reinit import ReinitWatch, run_initializer
from smartstage.runtime.producers.prefetch_threads import PrefetchThreads, start_prefetch_threads
from smartstage.runtime.stage.build import staged
from smartstage.runtime.stage.targets import mark_target_node, target_node_names

__all__ = [
    "AUTOTUNE",
    "PipelineStats",
    "TuningDecision",
    "STAGES_COLLECTION",
    "TARGETS_COLLECTION",
    "PipelineHook",
    "PipelineReport",
    "PrefetchHook",
    "PrefetchThreads",
    "ReinitWatch",
    "StageRecord",
    "add_stage_def",
    "make_pipeline_hook",
    "make_prefetch_hook",
    "mark_target_node",
    "run_initializer",
    "stage_defs",
    "stage_defs_from_meta_graph",
    "staged",
    "start_prefetch_threads",
    "target_node_names",
]
