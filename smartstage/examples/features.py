"""Feature preprocessing of the example models: what feature-column code does after the stage.

    parsed columns  ->  label    cast, reshape                        -> [B, 1] float32
                        I1..I13  fill NaN, log1p, (x - mean) / std      -> dense [B, 13]
                        I1, I3.. fill NaN, bucketize, cast              -> bucket/I1 [B] int64
                        C*       hash (to_hash_bucket_fast) or vocabulary table lookup (+ OOV)
                        C25, C26 string_split on "|", hash the values   -> a SparseTensor
                        C1 x C2  sparse.cross_hashed                    -> a SparseTensor

None of it reads a variable, so all of it may move to the prefetch side. `preprocess` returns a
flat dict of dense tensors (a SparseTensor as its three components), so the same dict can go
through a stage or come out of a `Dataset.map`; `categorical_inputs` turns it back into ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import tensorflow as tf

from smartstage.examples.data import CATEGORICAL_COLUMNS, DENSE_COLUMNS, LABEL_COLUMN, MULTIVALENT_SEPARATOR
from smartstage.examples.options import DENSE_LOG_MEAN, DENSE_LOG_STD, FeatureOptions

_SPARSE_PARTS = ("indices", "values", "dense_shape")
Table = Union[tf.lookup.StaticHashTable, tf.lookup.StaticVocabularyTable]


@dataclass(frozen=True)
class VocabularyTables:
    """Read-only lookup tables built from vocabulary files, and how many ids each column has."""

    tables: Mapping[str, Table]
    vocabulary_sizes: Mapping[str, int]
    num_oov_buckets: int

    def id_space(self, column: str) -> int:
        """Ids of `column`: the vocabulary, then `num_oov_buckets` out-of-vocabulary buckets."""
        return self.vocabulary_sizes[column] + self.num_oov_buckets


@dataclass(frozen=True)
class CategoricalInput:
    """One categorical feature ready for an embedding: dense ids [B] or a SparseTensor of ids."""

    name: str
    num_ids: int
    ids: Optional[tf.Tensor] = None
    sparse_ids: Optional[tf.SparseTensor] = None


def make_vocabulary_tables(
    options: FeatureOptions, vocabulary_paths: Optional[Mapping[str, str]]
) -> VocabularyTables:
    """Builds one read-only table per vocabulary column (none when `vocabulary_paths` is None).

    Columns alternate between two stock spellings: a StaticVocabularyTable (built-in OOV buckets)
    and a StaticHashTable with default -1, whose misses are hashed into OOV buckets by hand.
    """
    if vocabulary_paths is None:
        return VocabularyTables(tables={}, vocabulary_sizes={}, num_oov_buckets=options.num_oov_buckets)
    missing = [col for col in options.vocabulary_columns if col not in vocabulary_paths]
    if missing:
        raise ValueError(
            f"vocabulary files missing for {missing}; pass data.write_vocabularies(...) output, "
            "or vocabulary_paths=None to hash every column"
        )
    tables: dict[str, Table] = {}
    sizes: dict[str, int] = {}
    with tf.name_scope("vocabulary"):
        for k, col in enumerate(options.vocabulary_columns):
            path = str(vocabulary_paths[col])
            sizes[col] = len(Path(path).read_text(encoding="ascii").splitlines())
            init = tf.lookup.TextFileInitializer(
                path,
                tf.string,
                tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER,
                vocab_size=sizes[col],
                name=f"{col}_init",
            )
            if k % 2 == 0:
                tables[col] = tf.compat.v1.lookup.StaticVocabularyTable(
                    init, options.num_oov_buckets, name=f"{col}_table"
                )
            else:
                tables[col] = tf.compat.v1.lookup.StaticHashTable(init, default_value=-1, name=f"{col}_table")
    return VocabularyTables(tables=tables, vocabulary_sizes=sizes, num_oov_buckets=options.num_oov_buckets)


def _lookup(column: str, values: tf.Tensor, tables: VocabularyTables) -> tf.Tensor:
    table = tables.tables[column]
    ids = table.lookup(values, name=f"lookup_{column}")
    if isinstance(table, tf.compat.v1.lookup.StaticVocabularyTable):
        return ids
    oov = tf.strings.to_hash_bucket_fast(values, tables.num_oov_buckets, name=f"oov_{column}")
    return tf.where(ids >= 0, ids, oov + tables.vocabulary_sizes[column], name=f"with_oov_{column}")


def _put_sparse(out: dict[str, tf.Tensor], key: str, sparse: tf.SparseTensor) -> None:
    for part in _SPARSE_PARTS:
        out[f"{key}/{part}"] = getattr(sparse, part)


def sparse_feature(features: Mapping[str, tf.Tensor], key: str) -> tf.SparseTensor:
    """The SparseTensor `preprocess` stored under `key` ("multi/C25", "cross/C1_C2")."""
    return tf.SparseTensor(*(features[f"{key}/{part}"] for part in _SPARSE_PARTS))


def _check(options: FeatureOptions) -> None:
    crossed = {col for cross in options.crosses for col in cross}
    named = set(options.vocabulary_columns) | set(options.multivalent_columns) | crossed
    unknown = sorted(named - set(CATEGORICAL_COLUMNS))
    if unknown:
        raise ValueError(f"FeatureOptions name unknown categorical columns {unknown} (C1..C26)")
    crossed_multivalent = sorted(crossed & set(options.multivalent_columns))
    if crossed_multivalent:
        raise ValueError(f"FeatureOptions.crosses use multi-valued columns {crossed_multivalent}; use single-valued")
    bad_buckets = sorted(set(options.bucketized_columns) - set(DENSE_COLUMNS))
    if bad_buckets:
        raise ValueError(f"FeatureOptions.bucketized_columns {bad_buckets} are not dense columns I1..I13")


def preprocess(
    parsed: Mapping[str, tf.Tensor], options: FeatureOptions, tables: VocabularyTables
) -> dict[str, tf.Tensor]:
    """The feature preprocessing of the parsed columns, as a flat dict of dense tensors.

    Keys: "label", "dense", "bucket/<I>", "id/<C>" (single-valued), "multi/<C>/<part>",
    "cross/<C>_<C>/<part>" where <part> is indices, values or dense_shape.
    """
    _check(options)
    out: dict[str, tf.Tensor] = {}
    with tf.name_scope("preprocess"):
        out["label"] = tf.reshape(tf.cast(parsed[LABEL_COLUMN], tf.float32), [-1, 1], name="label")
        filled = {}
        for col in DENSE_COLUMNS:
            raw = parsed[col]
            filled[col] = tf.where(tf.math.is_nan(raw), tf.zeros_like(raw), raw, name=f"fill_{col}")
        dense = tf.stack([filled[col] for col in DENSE_COLUMNS], axis=1, name="dense_raw")
        logs = tf.math.log1p(tf.maximum(dense, 0.0), name="dense_log")
        out["dense"] = tf.math.divide(logs - tf.constant(DENSE_LOG_MEAN), tf.constant(DENSE_LOG_STD), name="dense")
        for col in options.bucketized_columns:
            buckets = tf.raw_ops.Bucketize(
                input=filled[col], boundaries=list(options.bucket_boundaries), name=f"bucketize_{col}"
            )
            out[f"bucket/{col}"] = tf.cast(buckets, tf.int64, name=f"bucket_{col}")
        for col in CATEGORICAL_COLUMNS:
            values = parsed[col]
            if col in options.multivalent_columns:
                split = tf.compat.v1.string_split(values, sep=MULTIVALENT_SEPARATOR)
                ids = tf.strings.to_hash_bucket_fast(split.values, options.hash_size, name=f"hash_{col}")
                _put_sparse(out, f"multi/{col}", tf.SparseTensor(split.indices, ids, split.dense_shape))
            elif col in tables.tables:
                out[f"id/{col}"] = _lookup(col, values, tables)
            else:
                out[f"id/{col}"] = tf.strings.to_hash_bucket_fast(values, options.hash_size, name=f"hash_{col}")
        for cross in options.crosses:
            name = "_".join(cross)
            crossed = tf.sparse.cross_hashed(
                [tf.reshape(parsed[col], [-1, 1]) for col in cross], options.cross_hash_size, name=f"cross_{name}"
            )
            _put_sparse(out, f"cross/{name}", crossed)
    return out


def categorical_inputs(
    features: Mapping[str, tf.Tensor], options: FeatureOptions, tables: VocabularyTables, *, crosses: bool = True
) -> list[CategoricalInput]:
    """Every categorical feature of `preprocess`'s dict, in a fixed order, with its id count."""
    inputs = [
        CategoricalInput(f"{col}_bucket", len(options.bucket_boundaries) + 1, ids=features[f"bucket/{col}"])
        for col in options.bucketized_columns
    ]
    for col in CATEGORICAL_COLUMNS:
        if col in options.multivalent_columns:
            inputs.append(CategoricalInput(col, options.hash_size, sparse_ids=sparse_feature(features, f"multi/{col}")))
        else:
            size = tables.id_space(col) if col in tables.tables else options.hash_size
            inputs.append(CategoricalInput(col, size, ids=features[f"id/{col}"]))
    if crosses:
        for cross in options.crosses:
            name = "_".join(cross)
            ids = sparse_feature(features, f"cross/{name}")
            inputs.append(CategoricalInput(name, options.cross_hash_size, sparse_ids=ids))
    return inputs


def combined_ids(inputs: list[CategoricalInput], name: str) -> tuple[tf.SparseTensor, int]:
    """All features' ids in one [B, n] SparseTensor, each offset past the previous id spaces.

    One lookup in one table of `num_ids` rows then serves them all (a shared weight table):

        C1 ids [B] + C25 ids (sparse) + C1_C2 ids (sparse)  ->  [B, 1 + k + m] ids in [0, total)
    """
    with tf.name_scope(name):
        parts, offset = [], 0
        for feature in inputs:
            if feature.sparse_ids is not None:
                sparse = feature.sparse_ids
            else:
                rows = tf.range(tf.shape(feature.ids, out_type=tf.int64)[0], dtype=tf.int64)
                indices = tf.stack([rows, tf.zeros_like(rows)], axis=1)
                sparse = tf.SparseTensor(indices, feature.ids, tf.stack([tf.size(rows, out_type=tf.int64), 1]))
            parts.append(tf.SparseTensor(sparse.indices, sparse.values + offset, sparse.dense_shape))
            offset += feature.num_ids
        return tf.sparse.concat(axis=1, sp_inputs=parts), offset
