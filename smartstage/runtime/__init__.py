"""The staging runtime on stock TensorFlow (graph mode, tf.compat.v1).

    features = staged(parse(batch), capacity=4, num_threads=2)      # a stage boundary in the graph
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[make_prefetch_hook()]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

Which stages run here: the ones on lanes. A stage whose prefetch side reads one tf.data iterator is folded
into the iterator's dataset by the SmartStage sessions, flag on or off (passes/fold_dataset.py, applied by
session/session.py): a deterministic map + prefetch, no buffer, no thread of ours, one session.run per step,
and a checkpoint restore trains every record once (the iterator's saved state holds what tf.data buffered).
Lanes remain for what tf.data cannot carry: queue readers, fed inputs (feed_dict), input tasks, error
policies a dataset has no equivalent for, and tf_data_stage="lanes" (or a plain stock Session, which does not
fold). A restore of a lanes stage is a stock queue's: the buffered batches are not saved, and a lanes stage
on a checkpointed iterator warns once (lanes/saved_inputs.py). Of a folded stage only the pipeline hook
reads anything (the step's trace).

Rooms, in the order they run (each imports only the rooms above it in this list; only door.py imports lanes/):

    stage/      build time: what staged() writes into the user's graph
        build.py        staged(): the buffer, put, take and guard ops, and the StageDef
        arguments.py    staged()'s argument checks (a ConfigError naming the argument)
        metadata.py     the StageDef collection: StageRecord, add_stage_def, stage_defs
        targets.py      mark_target_node: the nodes the main side must keep
        settings.py     AUTOTUNE (defined in protos/) and StageSettings.from_def(): the marker resolved once
    door.py     the one way into lanes/: lanes_stages(graph) (the stages left unfolded; imports nothing), then
                prepare_lanes, start_prefetch_threads, with_prefetch_pool, which import the room on first call
    lanes/      everything that exists only for a stage on lanes, imported only through door.py
        split.py, lanes.py, remote.py, batch_bytes.py
                        session start: the serial head, the ordered lanes (fed the head's values), input tasks
        saved_inputs.py warn_saved_iterators: a lanes stage reading a checkpointed iterator, warned once
        tuning/         while training, pure decisions: meter.py, autotune.py (Tuner), pools.py (prefetch pool)
        producers/      while training, the threads that fill a stage's buffer: ordered, sharded, unordered
                        producers, StageThreads (one stage), PrefetchThreads and start_prefetch_threads (a session)
    hooks/      session lifecycle: start and stop the producers (through door.py), observe, re-initialise
        prefetch_hook.py    PrefetchHook, make_prefetch_hook (MonitoredTrainingSession)
        pipeline_hook.py    PipelineHook: what limits the speed, per stage (folded stages from the step's trace)
        reinit.py           ReinitWatch, run_initializer: empty and refill a stage when its input restarts

PrefetchThreads, PipelineStats and TuningDecision are names of the room: reading them here imports it.

See docs/runtime.md.
"""

from smartstage.runtime.stage.settings import AUTOTUNE
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
from smartstage.runtime.door import ROOM_NAMES, room_attribute, start_prefetch_threads
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



def __getattr__(name: str):
    if name in ROOM_NAMES:
        return room_attribute(name)
    raise AttributeError(f"module 'smartstage.runtime' has no attribute {name!r}")
