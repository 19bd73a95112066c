"""Options of the example graphs, and what a builder returns.

    model = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=staged,
                       input_options=InputOptions(reader="queue", batch_size=64))
    model.train_op, model.loss, model.features        # a ModelGraph

Every option has a small default, so a test builds and runs a model in about a second;
`DLRMOptions.benchmark()` and `WideDeepOptions.benchmark()` give sizes where preprocessing matters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

import tensorflow as tf

from smartstage.examples.data import MULTIVALENT_COLUMNS

#: A stage: takes a structure of tensors (a dict or a list) and returns the same structure, taken
#: from behind a prefetching buffer. `smartstage.runtime.staged` (or a partial of it) is one.
StageFn = Callable[[Any], Any]


def no_stage(features: Any) -> Any:
    """The identity stage: the graph has no stage boundary."""
    return features


# log1p(max(x, 0)) statistics of I1..I13 measured on 200,000 generated rows (seed 0).
DENSE_LOG_MEAN = (2.68, 1.38, 0.65, 0.95, 3.31, 3.67, 2.57, 3.02, 2.33, 3.75, 3.32, 0.8, 3.47)
DENSE_LOG_STD = (0.88, 1.45, 0.81, 1.28, 1.48, 1.18, 1.35, 0.86, 1.01, 1.64, 1.6, 1.08, 1.29)
# Raw-value boundaries for the bucketized dense features: 0, 1, 2, 4, ..., 4096.
DEFAULT_BUCKET_BOUNDARIES = (0.0, 1.0) + tuple(float(2**k) for k in range(1, 13))


@dataclass(frozen=True)
class InputOptions:
    """How the CSV is read, up to the parsed columns (where the stage goes).

    reader: "queue" (string_input_producer + TextLineReader.read_up_to + train.batch) or
        "dataset" (TextLineDataset + batch + optional prefetch + an iterator).
    num_epochs: passes over the file; None repeats forever. After the last full batch the
        training step raises OutOfRangeError (a smaller final batch is dropped).
    prefetch: "dataset" only: a prefetch buffer size, -1 for AUTOTUNE, None for no prefetch.
    iterator: "dataset" only: "one_shot" or "initializable" (its initializer is in the
        LOCAL_INIT_OP collection and in `ModelGraph.init_op`).
    read_latency_ms: simulated storage latency per batch, on the read side: a SleepDataset
        after `batch` (before `prefetch`) for "dataset"; for "queue", a SleepDataset ticker that
        each `read_up_to` waits for, inside the reader thread that feeds `train.batch`.
    parse_in_dataset: "dataset" only: `decode_csv` runs in a `Dataset.map` instead of the graph.
    preprocess_in_dataset: "dataset" only: parsing and all feature preprocessing run in a
        `Dataset.map`; the stage then takes the preprocessed tensors. Needs
        iterator="initializable" when vocabulary tables are used (a one-shot iterator cannot
        capture a table).
    batch_threads: "queue" only: `train.batch` threads; more than 1 makes the order nondeterministic.
    """

    reader: Literal["queue", "dataset"] = "dataset"
    batch_size: int = 32
    num_epochs: Optional[int] = None
    prefetch: Optional[int] = None
    iterator: Literal["one_shot", "initializable"] = "one_shot"
    read_latency_ms: float = 0.0
    parse_in_dataset: bool = False
    preprocess_in_dataset: bool = False
    batch_threads: int = 1
    batch_capacity: int = 4

    def __post_init__(self) -> None:
        if self.reader not in ("queue", "dataset"):
            raise ValueError(f"InputOptions.reader must be 'queue' or 'dataset', got {self.reader!r}")
        if self.iterator not in ("one_shot", "initializable"):
            raise ValueError(f"InputOptions.iterator must be 'one_shot' or 'initializable', got {self.iterator!r}")
        if self.batch_size < 1:
            raise ValueError(f"InputOptions.batch_size must be at least 1, got {self.batch_size}")
        dataset_only = self.prefetch is not None or self.parse_in_dataset or self.preprocess_in_dataset
        if self.reader == "queue" and dataset_only:
            raise ValueError("InputOptions: prefetch, parse_in_dataset and preprocess_in_dataset need reader='dataset'")


@dataclass(frozen=True)
class FeatureOptions:
    """The preprocessing after the stage: which columns are hashed, looked up, split, crossed, bucketized.

    Categorical columns in `vocabulary_columns` are looked up in read-only tables built from the
    vocabulary files (with `num_oov_buckets` extra ids); the others are hashed into `hash_size`
    buckets. `multivalent_columns` are split on "|" into a SparseTensor. `crosses` are hashed
    feature crosses (tf.sparse.cross_hashed) into `cross_hash_size` buckets.
    """

    hash_size: int = 1000
    vocabulary_columns: tuple[str, ...] = ("C2", "C5", "C6", "C8", "C9", "C14", "C17", "C20", "C22", "C23")
    num_oov_buckets: int = 10
    multivalent_columns: tuple[str, ...] = MULTIVALENT_COLUMNS
    crosses: tuple[tuple[str, ...], ...] = (("C1", "C2"),)
    cross_hash_size: int = 1000
    bucketized_columns: tuple[str, ...] = ("I1", "I3", "I5")
    bucket_boundaries: tuple[float, ...] = DEFAULT_BUCKET_BOUNDARIES


def _benchmark_features() -> FeatureOptions:
    """Many crosses (pairs and triples) and every dense column bucketized: preprocessing that counts."""
    pairs = tuple((f"C{i}", f"C{i + 1}") for i in range(1, 24, 2))
    triples = (("C1", "C3", "C5"), ("C2", "C4", "C6"), ("C7", "C9", "C11"), ("C8", "C10", "C12"))
    return FeatureOptions(
        hash_size=20_000,
        cross_hash_size=2_000,
        crosses=pairs + triples,
        bucketized_columns=tuple(f"I{i}" for i in range(1, 14)),
    )


@dataclass(frozen=True)
class DLRMOptions:
    """Sizes of the DLRM-like model (bottom MLP, embeddings, dot interaction, top MLP).

    fused_embedding: one embedding table for every single-valued categorical column (ids offset
    into it), as large-scale systems do; fewer ops on the main side.
    """

    embedding_dim: int = 8
    bottom_mlp: tuple[int, ...] = (32,)
    top_mlp: tuple[int, ...] = (32,)
    learning_rate: float = 0.05
    fused_embedding: bool = False
    seed: int = 1234
    use_resource: bool = True
    features: FeatureOptions = field(default_factory=FeatureOptions)

    @classmethod
    def benchmark(cls) -> "DLRMOptions":
        """Benchmark sizes (use with batch_size 512+): a fused table, many crosses, bucketized columns.

        Sized so that the preprocessing after parsing is a real share of a step's CPU beside the model
        (`python -m smartstage.examples.timing` prints each side's rate).
        """
        return cls(
            embedding_dim=16, bottom_mlp=(64,), top_mlp=(64, 32), fused_embedding=True, features=_benchmark_features()
        )


@dataclass(frozen=True)
class WideDeepOptions:
    """Sizes of the Wide&Deep-like model (linear over hashed crosses + embeddings and an MLP)."""

    embedding_dim: int = 8
    deep_mlp: tuple[int, ...] = (32, 16)
    deep_optimizer: Literal["adagrad", "adam"] = "adagrad"
    wide_learning_rate: float = 0.05
    deep_learning_rate: float = 0.05
    seed: int = 4321
    use_resource: bool = True
    features: FeatureOptions = field(
        default_factory=lambda: FeatureOptions(crosses=(("C1", "C2"), ("C3", "C4"), ("C1", "C5", "C6")))
    )

    def __post_init__(self) -> None:
        if self.deep_optimizer not in ("adagrad", "adam"):
            raise ValueError(f"WideDeepOptions.deep_optimizer must be 'adagrad' or 'adam', got {self.deep_optimizer!r}")

    @classmethod
    def benchmark(cls) -> "WideDeepOptions":
        """Benchmark sizes (use with batch_size 512+): many crosses, every dense column bucketized."""
        return cls(embedding_dim=16, deep_mlp=(64, 32), features=_benchmark_features())


@dataclass(frozen=True)
class ModelGraph:
    """What a builder made in the default graph, and what a test or a benchmark fetches.

    features: the tensors after the stage (the identity stage: the parsed columns themselves).
    parsed: the tensors the stage was given.
    preprocessed: the model's inputs after all preprocessing (run them alone to time the input side).
    init_op: initialises variables, tables and the iterator, for a plain Session (a
        MonitoredTrainingSession finds the same through the standard collections).
    fetches: named tensors worth fetching each step (loss, predictions, labels, ...).
    """

    graph: tf.Graph
    train_op: tf.Operation
    loss: tf.Tensor
    global_step: tf.Variable
    predictions: tf.Tensor
    features: Mapping[str, tf.Tensor]
    parsed: Mapping[str, tf.Tensor]
    init_op: tf.Operation
    fetches: Mapping[str, tf.Tensor] = field(default_factory=dict)
    preprocessed: Mapping[str, tf.Tensor] = field(default_factory=dict)

    def fetch_names(self) -> dict[str, str]:
        """The graph names of `fetches`, plus "loss" and "train_op", for running an exported copy."""
        names = {key: tensor.name for key, tensor in self.fetches.items()}
        names.update(loss=self.loss.name, train_op=self.train_op.name, init_op=self.init_op.name)
        return names
