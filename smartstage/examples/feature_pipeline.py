"""From a CSV path to model-ready features, with the stage in the hand-placed spot after parsing.

    read (queue | tf.data) -> decode_csv -> stage_fn(parsed) -> preprocess -> features
    with preprocess_in_dataset:   read -> Dataset.map(decode_csv + preprocess) -> stage_fn(features)

The DLRM-like and the Wide&Deep-like builders share it; the stage_fn is the only place a stage
enters their graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import tensorflow as tf

from smartstage.examples.features import VocabularyTables, make_vocabulary_tables, preprocess
from smartstage.examples.inputs import read_batches
from smartstage.examples.options import FeatureOptions, InputOptions, StageFn


@dataclass(frozen=True)
class FeaturePipeline:
    """parsed: what the stage was given; staged: what it returned; features: the preprocessed dict."""

    parsed: Mapping[str, tf.Tensor]
    staged: Mapping[str, tf.Tensor]
    features: Mapping[str, tf.Tensor]
    tables: VocabularyTables
    iterator_initializer: Optional[tf.Operation]


def _apply_stage(stage_fn: StageFn, tensors: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    staged = stage_fn(dict(tensors))
    if not isinstance(staged, Mapping) or set(staged) != set(tensors):
        raise TypeError(
            "stage_fn must return a dict with the keys it was given "
            f"(got {type(staged).__name__}); smartstage.runtime.staged does"
        )
    return dict(staged)


def build_feature_pipeline(
    data_path: str,
    vocabulary_paths: Optional[Mapping[str, str]],
    input_options: InputOptions,
    feature_options: FeatureOptions,
    stage_fn: StageFn,
) -> FeaturePipeline:
    """Builds reading, parsing, the stage and the preprocessing in the default graph."""
    tables = make_vocabulary_tables(feature_options, vocabulary_paths)
    if input_options.preprocess_in_dataset:
        if tables.tables and input_options.iterator != "initializable":
            raise ValueError(
                "InputOptions(preprocess_in_dataset=True) with vocabulary tables needs iterator='initializable': "
                "a one-shot iterator cannot capture a lookup table"
            )
        pipeline = read_batches(data_path, input_options, dataset_fn=lambda p: preprocess(p, feature_options, tables))
        staged = _apply_stage(stage_fn, pipeline.columns)
        return FeaturePipeline(pipeline.columns, staged, staged, tables, pipeline.iterator_initializer)
    pipeline = read_batches(data_path, input_options)
    staged = _apply_stage(stage_fn, pipeline.columns)
    features = preprocess(staged, feature_options, tables)
    return FeaturePipeline(pipeline.columns, staged, features, tables, pipeline.iterator_initializer)
