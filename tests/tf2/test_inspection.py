"""A split TF2 step is inspectable like a v1 graph: summary(), the GraphDiff, the HTML report, explain, and
verify() comparing the split program with the original step by step.

    split = ss.tf2.split(step, ds)
    split.diff().moved; split.explain("Bucketize").text(); split.html(); ss.tf2.verify(step, ds).identical
"""

from __future__ import annotations

import numpy as np
import pytest
from tensorflow.python.eager import context

import smartstage.tf2 as sst
from smartstage.inspection.render import json_report, text_report
from smartstage.inspection.replay import AFTER_LAST_STEP, Run
from smartstage.tf2.step.compare import compare_runs
from tests.tf2.keras_models import preprocessing_model, raw_dataset as keras_dataset
from tests.tf2.steps import dlrm_program, raw_dataset

pytestmark = pytest.mark.usefixtures("eager")


@pytest.fixture(scope="module")
def split():
    with context.eager_mode():
        yield sst.split(dlrm_program().step, raw_dataset())


def test_graph_diff_lists_the_moved_and_pinned_nodes(split):
    diff = split.diff()
    moved = {m.name for m in diff.moved}
    assert moved == set(split.moved)
    assert all(m.to == "prefetch" for m in diff.moved)
    pinned = {p.name: p for p in diff.pinned}
    assert pinned["embedding_lookup"].kind == "variable"
    assert "Bucketize" in text_report(diff)
    assert '"moved"' in json_report(diff)


def test_explain_a_moved_and_a_pinned_node(split):
    moved = split.explain("Bucketize")
    assert moved.verdict == "moved" and "moved to the prefetch side" in moved.text()
    pinned = split.explain("embedding_lookup")
    assert pinned.verdict == "pinned" and pinned.kind == "variable"


def test_html_report(split):
    page = split.html()
    assert page.startswith("<!DOCTYPE html>") and "Bucketize" in page


def test_verify_finds_the_split_identical_and_trains_nothing():
    program = dlrm_program()
    before = [w.copy() for w in program.weights()]
    check = sst.verify(program.step, raw_dataset(), steps=12)
    assert check.identical, check.describe()
    assert check.describe().startswith("identical: 12 step(s), 1 fetch(es) each, then")
    for a, b in zip(before, program.weights()):
        np.testing.assert_array_equal(a, b)


def test_verify_fit_on_a_keras_model():
    model = preprocessing_model()
    weights = [w.copy() for w in model.get_weights()]
    check = sst.verify_fit(model, keras_dataset(), steps=8)
    assert check.identical, check.describe()
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))


def test_a_difference_is_named_with_its_step():
    before = Run(fetches=["Identity:0"], values=[[np.float32(1.0)], [np.float32(2.0)]],
                 variables={"0:w": np.ones(2)})
    after = Run(fetches=["Identity:0"], values=[[np.float32(1.0)], [np.float32(2.5)]], variables={"0:w": np.zeros(2)})
    comparison = compare_runs(before, after)
    assert not comparison.identical
    assert comparison.describe().startswith("step 1: Identity:0 differs")
    assert comparison.mismatches[-1].step == AFTER_LAST_STEP
