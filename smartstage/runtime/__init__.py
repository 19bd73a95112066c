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
on a checkpointed iterator warns once (stage/saved_inputs.py). Of a folded stage only the pipeline hook
reads anything (the step's trace).

Rooms, in the order they run (each imports only the rooms above it in this list; lanes and tuning never
import each other):

    stage/      build time: what staged() writes into the user's graph
        build.py        staged(): the buffer, put, take and guard ops, and the StageDef
        arguments.py    staged()'s argument checks (a ConfigError naming the argument)
        metadata.py     the StageDef collection: StageRecord, add_stage_def, stage_defs
        targets.py      mark_target_node: the nodes the main side must keep
        settings.py     AUTOTUNE (defined in protos/) and StageSettings.from_def(): the marker resolved once
        saved_inputs.py warn_saved_iterators: a lanes stage reading a checkpointed iterator, warned once
    lanes/      session start: graph surgery before the graph is finalized (starts no thread)
        split.py        split_prefetch_side: the serial head and the parallel body (graph/heads.py's rule)
        lanes.py        LaneGraph, lane_graph, prepare_lanes: a stage's ordered lanes
        handoff.py      the one body copy the shared lanes run on the head's values, inside TensorFlow
        remote.py       lanes on input tasks (RemotePlan, InputTaskError)
    tuning/     while training, pure decisions: measurements in, settings out (touches no graph)
        meter.py        StageMeter, Window: what a producer measures per batch and window
        autotune.py     Tuner (its Mode), TuningDecision, PipelineStats
        pools.py        the prefetch inter-op pool: made with the session, tried by the tuner
    producers/  while training, the threads that fill a stage's buffer
        host.py         ProducerHost and Owner: what a producer may ask of its stage, and a stage of its owner
        ordered.py      OrderedProducer: tickets, lanes and a merger (input order at any lane count)
        sharded.py      ShardedProducer: one lane per input task, round-robin
        unordered.py    UnorderedProducer: deterministic=False, k threads each run the put
        stage_threads.py    StageThreads: one stage's handles, error policy, lifecycle, watchdog (a ProducerHost)
        prefetch_threads.py PrefetchThreads, start_prefetch_threads: every stage of a session (an Owner)
        callables.py, control.py    the producers' TensorFlow callables; bounded control runs
    hooks/      session lifecycle: start and stop the producers, observe, re-initialise
        prefetch_hook.py    PrefetchHook, make_prefetch_hook (MonitoredTrainingSession)
        pipeline_hook.py    PipelineHook: what limits the speed, per stage (folded stages from the step's trace)
        reinit.py           ReinitWatch, run_initializer: empty and refill a stage when its input restarts

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
