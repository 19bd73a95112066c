"""verify_rewrite: the graph before and after optimize() run side by side; a broken rewrite is caught."""

from __future__ import annotations

import pytest
from tensorflow.core.protobuf import meta_graph_pb2

import smartstage as ss
from smartstage.errors import TargetError
from smartstage.inspection.verify_rewrite import default_fetches, verify_rewrite
from tests.inspection.graphs import demo_example

STEPS = 4
LOSS = "sigmoid_cross_entropy_loss/value:0"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    before = demo_example(tmp_path_factory.mktemp("demo"))
    return before, ss.optimize(before, ss.enable_smart_stage())


def test_rewrite_is_identical(demo):
    before, result = demo
    seen = []
    check = verify_rewrite(before, STEPS, result=result, progress=lambda phase, step: seen.append((phase, step)))
    assert check.identical, check.describe()
    assert check.steps == STEPS
    assert check.fetches == tuple(default_fetches(before)) and LOSS in check.fetches and "train_op" in check.fetches
    assert seen[0] == ("before", 1) and seen[-1] == ("after", STEPS)


def test_a_moved_tensor_is_fetched_through_the_take(demo):
    before, result = demo
    check = verify_rewrite(before, 2, result=result, fetches=["preprocess/hash_C1:0", "train_op"])
    assert check.after_fetches[0].startswith("stage/dataset_fold/IteratorGetNext:")  # the demo's stage is folded
    assert check.identical, check.describe()


def test_a_broken_rewrite_is_rejected(demo):
    #   after, broken:  dataset.map(decode_csv -> hash_C1 (63 buckets instead of 64)) -> get_next -> lookup(w) -> loss
    before, result = demo
    broken = meta_graph_pb2.MetaGraphDef()
    broken.CopyFrom(result.meta_graph_def)
    # the demo's stage is folded into its dataset: hash_C1 runs in the map function, imported as body/...
    (hash_c1,) = [n for f in broken.graph_def.library.function for n in f.node_def if n.name == "body/preprocess/hash_C1"]
    hash_c1.attr["num_buckets"].i -= 1
    check = verify_rewrite(before, STEPS, result=result, after=broken)
    assert not check.identical
    first = check.comparison.mismatches[0]
    assert first.fetch == LOSS and first.step == 0
    assert "differs" in check.describe()


def test_nothing_to_fetch(demo):
    before, result = demo
    with pytest.raises(TargetError, match="--fetch"):
        verify_rewrite(result.original_graph_def, 1, result=result)
