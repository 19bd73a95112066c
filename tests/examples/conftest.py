"""Shared data for the example tests: one small Criteo-like file and its vocabularies per session."""

import pytest

from smartstage.examples.data import CriteoFiles, prepare_criteo, write_deeprec_example_data


@pytest.fixture(scope="session")
def criteo(tmp_path_factory) -> CriteoFiles:
    """600 rows (seed 0) and vocabulary files of at most 50 values."""
    return prepare_criteo(tmp_path_factory.mktemp("criteo"), num_rows=600, seed=0, vocabulary_max_size=50)


@pytest.fixture(scope="session")
def deeprec_data(tmp_path_factory) -> str:
    """DeepRec's example file (20 lines of `key,value`)."""
    return write_deeprec_example_data(tmp_path_factory.mktemp("deeprec") / "1.txt")
