"""SmartStage: moves the input preprocessing of a TensorFlow training graph behind a prefetching stage.

    features = ss.staged(parse(batch))                 # the runtime: a stage on stock TensorFlow
    result = ss.optimize(graph_def, config)            # the optimizer: grow the stage, offline
    print(result.summary()); result.graph_def          # inspect, then run the rewritten graph

Names are imported on first use, so `import smartstage` (and the `smartstage` command, which must
quiet TensorFlow before importing it) does not import TensorFlow.
"""

from __future__ import annotations

import importlib

from smartstage.errors import (
    ConfigError,
    EagerModeError,
    GraphError,
    NoStageError,
    NothingToMoveError,
    PassError,
    SmartStageError,
    SplitError,
    StageRuntimeError,
    TargetError,
    VerificationError,
)

_LAZY = {
    "smartstage.inspection.replay": ("Comparison", "compare_runs", "run_steps"),
    "smartstage.config.deeprec": ("ConfigProto",),
    "smartstage.config.options": ("AutoStageOptions", "SmartStageOptions", "enable_smart_stage", "options_from_config",
                                  "to_session_config"),
    "smartstage.inspection.diff": ("GraphDiff", "graph_diff"),
    "smartstage.inspection.explain": ("Explanation", "explain"),
    "smartstage.graph.load": ("load_graph", "write_graph"),
    "smartstage.session.record": ("LiveRewrite", "live_rewrite_of"),
    "smartstage.session.monitored": ("MonitoredTrainingSession", "SmartMonitoredSession"),
    "smartstage.session.prefetch_hook": ("make_prefetch_hook",),
    "smartstage.optimizer": ("optimize",),
    "smartstage.result": ("OptimizeResult",),
    "smartstage.protos": ("STAGES_COLLECTION", "TARGETS_COLLECTION"),
    "smartstage.runtime": ("AUTOTUNE", "PipelineHook", "PipelineReport", "PrefetchHook", "PrefetchThreads",
                           "make_pipeline_hook", "mark_target_node",
                           "stage_defs", "stage_defs_from_meta_graph", "staged", "start_prefetch_threads",
                           "target_node_names"),
    "smartstage.session.session": ("Session",),
    "smartstage.inspection.verify_rewrite": ("RewriteCheck", "verify_rewrite"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted(
    ["ConfigError", "EagerModeError", "GraphError", "NoStageError", "NothingToMoveError", "PassError",
     "SmartStageError", "SplitError", "StageRuntimeError", "TargetError", "VerificationError", *_MODULE_OF]
)


def __getattr__(name: str):
    if name == "tf2":  # the TF2 entry points (smartstage.tf2), imported on first use like every name here
        return importlib.import_module("smartstage.tf2")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'smartstage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
