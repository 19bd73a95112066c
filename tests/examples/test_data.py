"""The synthetic Criteo-like data: deterministic, Criteo-shaped, with vocabularies that match it."""

import re

import numpy as np
import pytest

from smartstage.examples import data


def test_same_seed_writes_the_same_bytes(tmp_path):
    a = data.write_criteo_csv(tmp_path / "a.csv", 300, seed=3)
    b = data.write_criteo_csv(tmp_path / "b.csv", 300, seed=3)
    c = data.write_criteo_csv(tmp_path / "c.csv", 300, seed=4)
    assert open(a, "rb").read() == open(b, "rb").read()
    assert open(a, "rb").read() != open(c, "rb").read()


def test_rows_have_criteo_columns(criteo):
    rows = [line.split(",") for line in open(criteo.data_path).read().splitlines()]
    assert len(rows) == criteo.num_rows
    assert {len(row) for row in rows} == {40}
    table = dict(zip(data.ALL_COLUMNS, zip(*rows)))
    assert set(table["label"]) == {"0", "1"}
    for col in data.DENSE_COLUMNS:
        assert all(re.fullmatch(r"-?\d*", v) for v in table[col]), col
    assert any(v == "" for col in data.DENSE_COLUMNS for v in table[col]), "some dense values are empty"
    hex8 = re.compile(r"[0-9a-f]{8}")
    for col in data.CATEGORICAL_COLUMNS:
        tokens = [t for v in table[col] if v for t in v.split(data.MULTIVALENT_SEPARATOR)]
        assert all(hex8.fullmatch(t) for t in tokens), col
        if col in data.MULTIVALENT_COLUMNS:
            assert max(len(v.split("|")) for v in table[col]) > 1, col
    assert any(v == "" for col in data.CATEGORICAL_COLUMNS for v in table[col]), "some categorical values are empty"


def test_categorical_values_are_skewed():
    columns = data.generate_criteo_columns(5000, seed=0, vocab_scale=0.05)
    _, counts = np.unique([v for v in columns["C3"] if v], return_counts=True)
    counts = np.sort(counts)[::-1]
    assert counts[0] > 20 * np.median(counts), "Zipf-like: the top value dominates the median one"


def test_vocabularies_list_the_most_frequent_values_first(criteo, tmp_path):
    values = data.read_columns(criteo.data_path)
    words = open(criteo.vocabulary_paths["C3"]).read().splitlines()
    assert 0 < len(words) <= 50 and len(set(words)) == len(words)
    counts = [values["C3"].count(w) for w in words]
    assert counts == sorted(counts, reverse=True)
    # From the file or from the generated columns: the same files.
    again = data.write_vocabularies(criteo.data_path, tmp_path, max_size=50)
    assert all(open(again[c]).read() == open(criteo.vocabulary_paths[c]).read() for c in data.CATEGORICAL_COLUMNS)


def test_multivalent_vocabulary_holds_tokens(criteo):
    words = open(criteo.vocabulary_paths["C26"]).read().splitlines()
    assert words and all("|" not in w for w in words)


@pytest.mark.parametrize("kwargs", [dict(num_rows=0), dict(num_rows=5, multivalent_columns=("I1",))])
def test_bad_arguments_are_named(tmp_path, kwargs):
    with pytest.raises(ValueError, match="num_rows|multivalent_columns"):
        data.write_criteo_csv(tmp_path / "x.csv", **kwargs)


def test_deeprec_example_data(deeprec_data):
    lines = open(deeprec_data).read().splitlines()
    assert len(lines) == 20 and all(len(line.split(",")) == 2 for line in lines)
