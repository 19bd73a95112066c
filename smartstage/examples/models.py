"""Every example graph builder, in one place.

    build_dlrm(data_path, vocabulary_paths, stage_fn=..., options=..., input_options=...)  -> ModelGraph
    build_wide_deep(data_path, vocabulary_paths, stage_fn=..., options=..., input_options=...) -> ModelGraph
    build_demo(data_path, stage_fn=...)                                                   -> ModelGraph
    deeprec_smart_stage_example(data_path, stage_fn)                                      -> target tensor

Each builds into the current default tf.Graph (tf.compat.v1 style); in TF2's default eager mode, into a
new tf.Graph of its own (`model.graph`; `graph_mode.builds_a_v1_graph`). `stage_fn` places a stage on
the parsed columns (the hand-placed stage after parsing); the default `no_stage` places none.
"""

from __future__ import annotations

from smartstage.examples.deeprec import deeprec_smart_stage_example
from smartstage.examples.demo import build_demo
from smartstage.examples.dlrm import build_dlrm
from smartstage.examples.options import (
    DLRMOptions,
    FeatureOptions,
    InputOptions,
    ModelGraph,
    StageFn,
    WideDeepOptions,
    no_stage,
)
from smartstage.examples.wide_deep import build_wide_deep

__all__ = [
    "DLRMOptions",
    "FeatureOptions",
    "InputOptions",
    "ModelGraph",
    "StageFn",
    "WideDeepOptions",
    "build_demo",
    "build_dlrm",
    "build_wide_deep",
    "deeprec_smart_stage_example",
    "no_stage",
]
