"""SmartStage: moves the input preprocessing of a TensorFlow training graph behind a prefetching stage.

    features = ss.staged(parse(batch))                 # the runtime: a stage on stock TensorFlow
    result = ss.optimize(graph_def, config)            # the optimizer: grow the stage, offline
    print(result.summary()); result.graph_def          # inspect, then run the rewritten graph
"""

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

__all__ = [
    "ConfigError",
    "GraphError",
    "NoStageError",
    "PassError",
    "SmartStageError",
    "StageRuntimeError",
    "TargetError",
    "VerificationError",
]
