"""DeepRec-only APIs of the model-zoo scripts: mapped where stock TensorFlow computes the same, else one clear error.

    before:  tf.train.AdamAsyncOptimizer(0.01)      # AttributeError: module ... has no attribute
    after:   DeepRecFeatureError: tf.train.AdamAsyncOptimizer is DeepRec-only (...); run the script
             with --optimizer adam

Each entry names the feature, why stock TensorFlow cannot run it, and the model-zoo flag that turns it
off; docs/porting-deeprec.md has the same list. Names are resolved when called, not when looked up,
so `hasattr(tf.train, "AdamAsyncOptimizer")` still answers True, as on DeepRec.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as _tf

from smartstage.config.deeprec import refuse_micro_batch
from smartstage.errors import ConfigError, DeepRecFeatureError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unsupported:
    """One DeepRec-only API: its `tf.` name, why stock TensorFlow has no equivalent, the flag that turns it off."""

    name: str
    reason: str
    turn_off: str

    def message(self) -> str:
        return (f"{self.name} is DeepRec-only ({self.reason}); stock TensorFlow has no equivalent: "
                f"run the script with {self.turn_off}")


UNSUPPORTED = {
    "train.AdamAsyncOptimizer": Unsupported(
        "tf.train.AdamAsyncOptimizer", "Adam whose beta powers are per-variable slots updated without locks, "
        "so its updates differ from AdamOptimizer's", "--optimizer adam"),
    "train.AdagradDecayOptimizer": Unsupported(
        "tf.train.AdagradDecayOptimizer", "Adagrad whose accumulators decay on a global-step schedule",
        "--optimizer adagrad"),
    "EmbeddingVariableConfig": Unsupported(
        "tf.EmbeddingVariableConfig", "configures DeepRec's EmbeddingVariable kernels", "--ev False"),
    "get_embedding_variable": Unsupported(
        "tf.get_embedding_variable", "a dynamically growing hash-table variable (EmbeddingVariable)", "--ev False"),
    "feature_column.categorical_column_with_embedding": Unsupported(
        "tf.feature_column.categorical_column_with_embedding",
        "a column backed by an EmbeddingVariable, a hash table that grows with the ids it sees", "--ev False"),
    "feature_column.categorical_column_with_adaptive_embedding": Unsupported(
        "tf.feature_column.categorical_column_with_adaptive_embedding",
        "an embedding split between a static table and an EmbeddingVariable", "--adaptive_emb False"),
    "feature_column.group_embedding_column_scope": Unsupported(
        "tf.feature_column.group_embedding_column_scope", "DeepRec's grouped embedding lookup kernels",
        "--group_embedding None (leave the flag out)"),
    "GlobalStepEvict": Unsupported(
        "tf.GlobalStepEvict", "evicts EmbeddingVariable ids by age", "--ev_elimination None (leave the flag out)"),
    "L2WeightEvict": Unsupported(
        "tf.L2WeightEvict", "evicts EmbeddingVariable ids by weight norm", "--ev_elimination None (leave the flag out)"),
    "CounterFilter": Unsupported(
        "tf.CounterFilter", "admits ids into an EmbeddingVariable by frequency", "--ev_filter None (leave the flag out)"),
    "CBFFilter": Unsupported(
        "tf.CBFFilter", "admits ids into an EmbeddingVariable through a counting Bloom filter",
        "--ev_filter None (leave the flag out)"),
    "get_multihash_variable": Unsupported(
        "tf.get_multihash_variable", "an embedding built from several smaller hashed tables (Multi-Hash Variable)",
        "--multihash False"),
    "config.experimental.enable_distributed_strategy": Unsupported(
        "tf.config.experimental.enable_distributed_strategy", "starts DeepRec's group-embedding "
        "strategy (localized or collective)", "--group_embedding None (leave the flag out)"),
}

WORK_QUEUE = Unsupported(
    "tensorflow.python.ops.work_queue.WorkQueue", "a shared queue of file names served by DeepRec's kernels",
    "--workqueue False")
PARQUET_DATASET = Unsupported(
    "tensorflow.python.data.experimental.ops.parquet_dataset_ops.ParquetDataset",
    "DeepRec's Parquet reader kernels", "--parquet_dataset False (the CSV input)")
KEEP_WEIGHTS = Unsupported(
    "tf.variable_scope(...).keep_weights", "DeepRec's BF16 scope keeping float32 master weights",
    "without --bf16")


def refuse_config_features(config: Any) -> None:
    """Raises DeepRecFeatureError for a DeepRec config field whose absence changes the training: micro_batch_num > 1.

        before:  config.graph_options.optimizer_options.micro_batch_num = 2   # ignored: half-size batches trained
        after:   DeepRecFeatureError: ...micro_batch_num=2 is DeepRec-only (...): run the script with --micro_batch 0

    The other fields stock TensorFlow lacks (do_op_fusion, do_async_embedding, ...) only change speed, so the
    config layer accepts them and logs them as not applied; a stock ConfigProto has none of them.
    """
    options = getattr(getattr(config, "graph_options", None), "optimizer_options", None)
    if options is not None:
        refuse_micro_batch(options)


def raiser(entry: Unsupported) -> Callable[..., Any]:
    """A callable that raises DeepRecFeatureError for `entry` when called."""

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise DeepRecFeatureError(entry.message())

    unsupported.__name__ = entry.name.rsplit(".", 1)[-1]
    unsupported.__doc__ = entry.message()
    return unsupported


@dataclass(frozen=True)
class EmbeddingVariableOption:
    """DeepRec's `tf.EmbeddingVariableOption`: accepted, since the model-zoo scripts build one even with
    --ev False; using it (categorical_column_with_embedding) raises DeepRecFeatureError."""

    ht_type: Any = None
    ht_partition_num: int = 1000
    evict_option: Any = None
    ckpt: Any = None
    filter_option: Any = None
    storage_option: Any = None
    init_option: Any = None


@functools.lru_cache(maxsize=None)
def log_once(message: str) -> None:
    """Logs `message` at WARNING the first time only."""
    logger.warning("%s", message)


class variable_scope(_tf.compat.v1.variable_scope):  # noqa: N801  (TensorFlow's name)
    """tf.compat.v1.variable_scope; DeepRec's `keep_weights()` (BF16 training) raises DeepRecFeatureError."""

    def keep_weights(self, *args: Any, **kwargs: Any):
        raise DeepRecFeatureError(KEEP_WEIGHTS.message())
