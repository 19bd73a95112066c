"""GraphDiff: golden text and JSON of hand-built and example graphs, the JSON form, any-two-graphs diffs."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.inspection.diff import SCHEMA_VERSION, GraphDiff, graph_diff
from smartstage.errors import GraphError
from smartstage.inspection.render.json_report import json_report, read_json_report
from smartstage.inspection.render.text import text_report
from tests.builder import G, N, node
from tests.inspection.graphs import check_golden, deeprec_example, dlrm_example, dlrm_like_graph, tiny_graph

ON = ss.enable_smart_stage()


@pytest.fixture(scope="module")
def tiny():
    return ss.optimize(tiny_graph(), ON)


@pytest.fixture(scope="module")
def deeprec(tmp_path_factory):
    return ss.optimize(deeprec_example(tmp_path_factory.mktemp("deeprec")), ON)


@pytest.fixture(scope="module")
def dlrm():
    return ss.optimize(dlrm_like_graph(), ON)


@pytest.fixture(scope="module")
def examples_dlrm(tmp_path_factory):
    return ss.optimize(dlrm_example(tmp_path_factory.mktemp("dlrm")), ON)


@pytest.mark.parametrize("example", ["tiny", "deeprec", "dlrm"])
def test_golden_text_and_json(example, request):
    result = request.getfixturevalue(example)
    diff = result.diff()
    check_golden(f"{example}.diff.txt", text_report(diff))
    check_golden(f"{example}.diff.json", json_report(diff))


def test_tiny_diff_content(tiny):
    diff = tiny.diff()
    assert [(m.name, m.to, m.stage) for m in diff.moved] == [("hash", "prefetch", "q"), ("upper", "prefetch", "q"),
                                                             ("as_number", "prefetch", "q")]
    assert {p.name: p.kind for p in diff.pinned} == {"lookup": "variable", "loss": "variable", "total": "variable"}
    assert diff.chain("total", "q") == ("total", "loss", "lookup", "w/read", "w")
    [stage] = diff.stages
    assert stage.boundary_before == ("reader:0",)
    assert stage.boundary_after == ("hash:0", "as_number:0")
    assert {r.name for r in diff.rewired} == {"put", "hash", "upper", "lookup", "total"}
    assert {(a.name, a.attr) for a in diff.attr_changes} == {("q", "component_types"), ("put", "Tcomponents"),
                                                            ("take", "component_types")}
    assert not diff.added and not diff.removed and not diff.device_changes


@pytest.mark.parametrize("example", ["dlrm", "examples_dlrm"])
def test_moved_matches_the_optimizer(example, request):
    """Sides found from the graphs alone agree with the partition (free nodes never count as moved)."""
    result = request.getfixturevalue(example)
    diff = result.diff()
    moved = {m.name for m in diff.moved if m.to == "prefetch"}
    assert moved and moved <= result.moved()
    assert not [m for m in diff.moved if m.to == "main"]
    assert {p.name for p in diff.pinned} == {n for p in result.partitions for n in p.pinned}


def test_json_round_trip_and_schema(deeprec):
    diff = deeprec.diff()
    document = json.loads(json_report(diff))
    assert document["schema"] == "smartstage.graph_diff" and document["schema_version"] == SCHEMA_VERSION
    assert list(document) == ["schema", "schema_version", "before", "after", "counts", "has_pins", "stages",
                              "moved", "pinned", "added", "removed", "rewired", "op_changes", "device_changes",
                              "attr_changes", "notes"]
    again = read_json_report(json_report(diff))
    assert again == diff
    assert text_report(again) == text_report(diff), "text from JSON equals text from the graphs"
    with pytest.raises(GraphError, match="not a GraphDiff"):
        GraphDiff.from_dict({"schema": "other"})
    with pytest.raises(GraphError, match="schema_version 99"):
        GraphDiff.from_dict(dict(document, schema_version=99))


def test_deterministic(dlrm):
    assert json_report(dlrm.diff()) == json_report(dlrm.diff())


def test_identical_graphs():
    diff = graph_diff(tiny_graph(), tiny_graph())
    assert diff.is_empty and not diff.has_pins and not diff.pinned
    assert "the graphs are identical" in text_report(diff)


def test_any_two_graphs_without_a_result(tiny):
    """No OptimizeResult: moves still come from the stages of each graph; pins are unknown."""
    diff = graph_diff(tiny.original_graph_def, tiny.graph_def)
    assert [m.name for m in diff.moved] == ["hash", "upper", "as_number"]
    assert not diff.has_pins and diff.pinned == ()
    assert "pinned ?" in text_report(diff)
    back = graph_diff(tiny.graph_def, tiny.original_graph_def)
    assert [(m.name, m.to) for m in back.moved] == [("hash", "main"), ("upper", "main"), ("as_number", "main")]


def test_added_removed_devices_attrs_ops():
    #   before: x -> a -> b          after: x -> a' (Neg, on CPU, new attr) -> c
    before = G(N("x", "Placeholder", dtype=tf.float32), N("a", "Identity", ["x"], T=tf.float32),
               N("b", "Identity", ["a"], T=tf.float32))
    after = G(N("x", "Placeholder", dtype=tf.float32), N("a", "Neg", ["x", "^x"], device="/CPU:0", T=tf.float32),
              N("c", "Identity", ["a"], T=tf.float32))
    diff = graph_diff(before, after)
    assert [(n.name, n.op) for n in diff.added] == [("c", "Identity")]
    assert [(n.name, n.op) for n in diff.removed] == [("b", "Identity")]
    assert [(v.name, v.before, v.after) for v in diff.op_changes] == [("a", "Identity", "Neg")]
    assert [(v.name, v.before, v.after) for v in diff.device_changes] == [("a", "", "/CPU:0")]
    assert [(r.name, r.before, r.after) for r in diff.rewired] == [("a", ("x",), ("x", "^x"))]
    assert diff.stages == () and diff.moved == ()
    assert "no stage in either graph" in text_report(diff)


@pytest.mark.parametrize("value, text", [
    (tf.float32, "float"), ([tf.int64, tf.string], "[int64, string]"), (3, "3"), (True, "true"),
    ("abc", "'abc'"), ([1, 2], "[1, 2]"),
])
def test_attribute_values_read_well(value, text):
    before = G(N("n", "NoOp"))
    after = G(N("n", "NoOp", v=value))
    [change] = graph_diff(before, after).attr_changes
    assert (change.attr, change.before, change.after) == ("v", None, text)


def test_the_input_graphs_are_not_mutated(tiny):
    snapshot = tiny.original_graph_def.SerializeToString()
    graph_diff(tiny.original_graph_def, tiny.graph_def, result=tiny)
    assert tiny.original_graph_def.SerializeToString() == snapshot
    assert node(tiny.graph_def, "hash").input == ["reader"]
