"""Synthetic Criteo-like click logs: a CSV file and per-column vocabulary files.

    write_criteo_csv("train.csv", num_rows=1000, seed=0)
    ->  1,3,,12,0,...,7c2ea1f0,,9a04b3c1|05e1d2aa,...        (no header, ',' between fields)

Each row is `label, I1..I13, C1..C26`:
- label: 0/1, about a quarter positive, a logistic function of a few features (so a model can learn);
- I1..I13: heavy-tailed non-negative integers (log-normal), I2 sometimes -1, each column with its
  own share of empty values;
- C1..C26: 8-digit hex strings drawn from a per-column vocabulary with Zipf-like frequencies, each
  column with its own share of empty values. The columns in `MULTIVALENT_COLUMNS` hold 0..5
  such strings joined by `MULTIVALENT_SEPARATOR` (a multi-valued feature for the sparse path).

Everything is a function of `seed` and the arguments only: the same call writes the same bytes.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

NUM_DENSE = 13
NUM_CATEGORICAL = 26
LABEL_COLUMN = "label"
DENSE_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
ALL_COLUMNS: tuple[str, ...] = (LABEL_COLUMN, *DENSE_COLUMNS, *CATEGORICAL_COLUMNS)
MULTIVALENT_COLUMNS: tuple[str, ...] = ("C25", "C26")
MULTIVALENT_SEPARATOR = "|"
FIELD_DELIMITER = ","
MAX_MULTIVALENT_LENGTH = 5

# Per-column vocabulary sizes at scale 1.0: a spread like Criteo's (a few tiny, a few huge columns).
_BASE_VOCAB_SIZES = (
    1400, 550, 200_000, 120_000, 300, 24, 12_000, 630, 3, 50_000, 5_500, 180_000, 3_200,
    27, 14_000, 150_000, 10, 5_600, 2_100, 4, 170_000, 18, 15, 60_000, 100, 40_000,
)


@dataclass(frozen=True)
class CriteoFiles:
    """Where `prepare_criteo` wrote the data and the vocabularies."""

    data_path: str
    vocabulary_paths: Mapping[str, str]
    num_rows: int
    seed: int


def vocabulary_sizes(vocab_scale: float = 0.05) -> dict[str, int]:
    """The generator's vocabulary size per categorical column (at least 3 values each)."""
    return {col: max(3, int(size * vocab_scale)) for col, size in zip(CATEGORICAL_COLUMNS, _BASE_VOCAB_SIZES)}


def _vocabulary_strings(column_index: int, size: int) -> np.ndarray:
    """The `size` hex strings of one column, rank 0 first; a fixed function of the column and rank."""
    # A 64-bit mix of (column, rank) (splitmix64's finaliser); its high 32 bits look random and
    # collide within a column only with negligible probability.
    x = np.arange(size, dtype=np.uint64) + np.uint64((column_index + 1) << 32)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    codes = (x ^ (x >> np.uint64(31))) >> np.uint64(32)
    return np.array([f"{c:08x}" for c in codes.tolist()], dtype=object)


def _zipf_ranks(rng: np.random.Generator, size: int, count: int, exponent: float) -> np.ndarray:
    """`count` ranks in [0, size) with P(rank k) proportional to 1 / (k + 1) ** exponent."""
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(count), side="right"), size - 1)


def _dense_columns(rng: np.random.Generator, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer values [rows, 13] and a missing mask [rows, 13]."""
    mu = rng.uniform(0.5, 4.0, NUM_DENSE)
    sigma = rng.uniform(0.8, 2.0, NUM_DENSE)
    values = np.floor(rng.lognormal(mu, sigma, (num_rows, NUM_DENSE)) - 1.0).clip(0, 2**31 - 1).astype(np.int64)
    values[:, 1] -= (rng.random(num_rows) < 0.1).astype(np.int64) * (values[:, 1] + 1)  # I2: some -1
    missing_rate = rng.uniform(0.0, 0.45, NUM_DENSE)
    missing_rate[1] = 0.0  # I2 is never empty in Criteo either
    missing = rng.random((num_rows, NUM_DENSE)) < missing_rate
    return values, missing


def _format_ints(values: np.ndarray, missing: np.ndarray) -> np.ndarray:
    text = values.astype(str).astype(object)
    text[missing] = ""
    return text


def generate_criteo_columns(
    num_rows: int,
    seed: int = 0,
    *,
    vocab_scale: float = 0.05,
    zipf_exponent: float = 1.1,
    multivalent_columns: Sequence[str] = MULTIVALENT_COLUMNS,
) -> dict[str, np.ndarray]:
    """The text of every column (`ALL_COLUMNS` order), as object arrays of `num_rows` strings.

    `vocab_scale` scales every column's vocabulary (1.0 gives Criteo-like sizes up to 200,000).
    """
    if num_rows < 1:
        raise ValueError(f"generate_criteo_columns: num_rows must be at least 1, got {num_rows}")
    unknown = sorted(set(multivalent_columns) - set(CATEGORICAL_COLUMNS))
    if unknown:
        raise ValueError(f"generate_criteo_columns: multivalent_columns {unknown} are not categorical columns C1..C26")
    rng = np.random.default_rng(seed)
    dense, dense_missing = _dense_columns(rng, num_rows)
    categorical: dict[str, np.ndarray] = {}
    cat_missing_rate = rng.uniform(0.0, 0.4, NUM_CATEGORICAL)
    first_ranks = []
    for j, (col, size) in enumerate(vocabulary_sizes(vocab_scale).items()):
        vocab = _vocabulary_strings(j, size)
        ranks = _zipf_ranks(rng, size, num_rows, zipf_exponent)
        first_ranks.append(ranks)
        if col in multivalent_columns:
            lengths = rng.integers(0, MAX_MULTIVALENT_LENGTH + 1, num_rows)
            extra = _zipf_ranks(rng, size, num_rows * MAX_MULTIVALENT_LENGTH, zipf_exponent)
            tokens = np.concatenate([ranks[:, None], extra.reshape(num_rows, MAX_MULTIVALENT_LENGTH)[:, 1:]], axis=1)
            text = np.array(
                [MULTIVALENT_SEPARATOR.join(vocab[row[:n]]) for row, n in zip(tokens, lengths.tolist())], dtype=object
            )
        else:
            text = vocab[ranks]
            text[rng.random(num_rows) < cat_missing_rate[j]] = ""
        categorical[col] = text
    # The label depends on a few dense values and on whether a few categorical values are frequent.
    logit = (
        -1.6
        + 0.35 * np.log1p(np.maximum(dense[:, 0], 0))
        - 0.25 * np.log1p(np.maximum(dense[:, 4], 0))
        + 0.9 * (first_ranks[0] < 3)
        - 0.7 * (first_ranks[5] == 0)
    )
    label = (rng.random(num_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    columns = {LABEL_COLUMN: label.astype(str).astype(object)}
    columns.update({col: _format_ints(dense[:, k], dense_missing[:, k]) for k, col in enumerate(DENSE_COLUMNS)})
    columns.update(categorical)
    return columns


def _write_columns(path: str | os.PathLike, columns: Mapping[str, np.ndarray]) -> str:
    table = np.stack([columns[name] for name in ALL_COLUMNS], axis=1).tolist()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="ascii", newline="") as out:
        out.write("\n".join(FIELD_DELIMITER.join(row) for row in table))
        out.write("\n")
    return str(path)


def write_criteo_csv(
    path: str | os.PathLike,
    num_rows: int,
    seed: int = 0,
    *,
    vocab_scale: float = 0.05,
    zipf_exponent: float = 1.1,
    multivalent_columns: Sequence[str] = MULTIVALENT_COLUMNS,
) -> str:
    """Writes `num_rows` Criteo-like rows to `path` (no header) and returns the path.

        write_criteo_csv("/tmp/t.csv", 200_000)    # about 50 MB, a few seconds
        write_criteo_csv("/tmp/t.csv", 64, seed=1) # a small file for a test
    """
    columns = generate_criteo_columns(
        num_rows, seed, vocab_scale=vocab_scale, zipf_exponent=zipf_exponent, multivalent_columns=multivalent_columns
    )
    return _write_columns(path, columns)


def read_columns(data_path: str | os.PathLike) -> dict[str, list[str]]:
    """The text of every column of a file written by `write_criteo_csv` (`ALL_COLUMNS` order)."""
    # The generator never quotes a field, so a plain split reads what it wrote (faster than csv).
    rows = [line.split(FIELD_DELIMITER) for line in Path(data_path).read_text(encoding="ascii").splitlines()]
    return {name: [row[k] for row in rows] for k, name in enumerate(ALL_COLUMNS)}


def _tokens(fields: Sequence[str]) -> list[str]:
    """The non-empty values of one column, multi-valued fields split into their tokens."""
    joined = MULTIVALENT_SEPARATOR.join(field for field in fields if field)
    return joined.split(MULTIVALENT_SEPARATOR) if joined else []


def write_vocabularies(
    source: str | os.PathLike | Mapping[str, Sequence[str]],
    out_dir: str | os.PathLike,
    columns: Sequence[str] = CATEGORICAL_COLUMNS,
    *,
    max_size: int = 1000,
    min_count: int = 1,
) -> dict[str, str]:
    """Writes one vocabulary file per column (`<out_dir>/<column>.txt`) and returns column -> path.

        C1.txt:  7c2ea1f0\\n05e1d2aa\\n...     (the most frequent values first, at most `max_size`)

    `source` is a CSV path or the columns `generate_criteo_columns` returned (faster: no parsing).
    Ties are broken by value, so the files are deterministic. Line k of a file is id k, the layout
    `tf.lookup.TextFileInitializer` (TextFileIndex.LINE_NUMBER) expects.
    """
    unknown = sorted(set(columns) - set(CATEGORICAL_COLUMNS))
    if unknown:
        raise ValueError(f"write_vocabularies: {unknown} are not categorical columns C1..C26")
    table = read_columns(source) if isinstance(source, (str, os.PathLike)) else source
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    for name in columns:
        counts = collections.Counter(_tokens(table[name]))
        ranked = sorted((item for item in counts.items() if item[1] >= min_count), key=lambda kv: (-kv[1], kv[0]))
        words = [word for word, _ in ranked[:max_size]] or ["<empty-vocabulary>"]
        target = out / f"{name}.txt"
        target.write_text("\n".join(words) + "\n", encoding="ascii")
        paths[name] = str(target)
    return paths


def prepare_criteo(
    out_dir: str | os.PathLike,
    num_rows: int,
    seed: int = 0,
    *,
    vocab_scale: float = 0.05,
    vocabulary_max_size: int = 1000,
) -> CriteoFiles:
    """Writes `<out_dir>/train.csv` and `<out_dir>/vocab/C*.txt`; returns their paths."""
    out = Path(out_dir)
    columns = generate_criteo_columns(num_rows, seed, vocab_scale=vocab_scale)
    data_path = _write_columns(out / "train.csv", columns)
    vocab = write_vocabularies(columns, out / "vocab", max_size=vocabulary_max_size)
    return CriteoFiles(data_path=data_path, vocabulary_paths=vocab, num_rows=num_rows, seed=seed)


def write_deeprec_example_data(path: str | os.PathLike, num_lines: int = 20) -> str:
    """Writes the two-string-column file that DeepRec's SmartStage example reads (its `1.txt`).

        key0,value0
        key1,value1
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    lines = [f"key{i % 7},value{i}" for i in range(num_lines)]
    Path(path).write_text("\n".join(lines) + "\n", encoding="ascii")
    return str(path)
