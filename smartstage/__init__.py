"""SmartStage: moves the input preprocessing of a TensorFlow training graph behind a prefetching stage.

    features = ss.staged(parse(batch))                 # the runtime: a stage on stock TensorFlow
    result = ss.optimize(graph_def, config)            # the optimizer: grow the stage, offline
    print(result.summary()); result.graph_def          # inspect, then run the rewritten graph
"""

from smartstage.compare import Comparison, compare_runs, run_steps
from smartstage.config import (
    AutoStageOptions,
    ConfigProto,
    SmartStageOptions,
    enable_smart_stage,
    options_from_config,
    to_session_config,
)
from smartstage.errors import (
    ConfigError,
    GraphError,
    NoStageError,
    PassError,
    SmartStageError,
    StageRuntimeError,
    TargetError,
    VerificationError,
)
from smartstage.io import load_graph, write_graph
from smartstage.live_rewrite import LiveRewrite, live_rewrite_of
from smartstage.optimize import OptimizeResult, optimize
from smartstage.runtime import (
    PrefetchHook,
    PrefetchThreads,
    make_prefetch_hook,
    mark_target_node,
    stage_defs,
    staged,
    start_prefetch_threads,
)
from smartstage.monitored import MonitoredTrainingSession, SmartMonitoredSession
from smartstage.session import Session

__all__ = [
    "AutoStageOptions",
    "Comparison",
    "ConfigError",
    "ConfigProto",
    "GraphError",
    "LiveRewrite",
    "MonitoredTrainingSession",
    "NoStageError",
    "OptimizeResult",
    "PassError",
    "PrefetchHook",
    "PrefetchThreads",
    "Session",
    "SmartMonitoredSession",
    "SmartStageError",
    "SmartStageOptions",
    "StageRuntimeError",
    "TargetError",
    "VerificationError",
    "compare_runs",
    "enable_smart_stage",
    "live_rewrite_of",
    "load_graph",
    "make_prefetch_hook",
    "mark_target_node",
    "optimize",
    "options_from_config",
    "run_steps",
    "stage_defs",
    "staged",
    "start_prefetch_threads",
    "to_session_config",
    "write_graph",
]
