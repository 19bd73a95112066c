"""SmartStage: moves the input preprocessing of a TensorFlow training graph behind a prefetching stage.

    features = ss.staged(parse(batch))                 # the runtime: a stage on stock TensorFlow
    result = ss.optimize(graph_def, config)            # the optimizer: grow the stage, offline
    print(result.summary()); result.graph_def          # inspect, then run the rewritten graph

Names are imported on first use, so `import smartstage` (and the `smartstage` command, which must
quiet TensorFlow before importing it) does not import TensorFlow.
"""

from __future__ import annotations

import importlib

from smartstage import errors as _errors

# Every error type of smartstage.errors (SmartStageError and its subclasses), each under its own name.
_ERRORS = {name: value for name, value in vars(_errors).items()
           if isinstance(value, type) and issubclass(value, _errors.SmartStageError)}
globals().update(_ERRORS)

_LAZY = {
    "smartstage.inspection.replay": ("Comparison", "compare_runs", "run_steps"),
    "smartstage.inspection.loopback": ("LoopbackCluster", "LoopbackClusterError"),
    "smartstage.inspection.placement": ("placement_lines", "stage_placements"),
    "smartstage.inspection.render": ("dot_source", "html_report", "json_report", "svg_drawing", "text_report",
                                     "write_tensorboard"),
    "smartstage.inspection.render.dot": ("GraphvizMissing",),
    "smartstage.graph.view": ("GraphView",),
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
                           "run_initializer", "stage_defs", "stage_defs_from_meta_graph", "staged",
                           "start_prefetch_threads", "target_node_names"),
    "smartstage.session.session": ("Session",),
    "smartstage.inspection.verify_rewrite": ("RewriteCheck", "verify_rewrite"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted([*_ERRORS, *_MODULE_OF])

# Subpackages reachable as attributes after `import smartstage as ss` (ss.tf2.fit, ss.runtime.staged, ...),
# imported on first use like every name here.
_SUBPACKAGES = ("compat", "config", "errors", "examples", "graph", "inspection", "passes", "protos", "runtime",
                "session", "tf2")


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"smartstage.{name}")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'smartstage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
