"""The edit log's GraphDef applier: each edit kind on a hand-drawn graph, with the result written out, and
all-or-nothing on bad edits."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2

from smartstage.errors import GraphError
from smartstage.graph.edits import (AddFunction, AddNode, EditLog, MoveToEnd, RemoveNode, SetAttr, SetDevice,
                                    SetInputs, SetStageDef, apply_to_graph_def, dedupe_controls, stage_defs_after,
                                    touched_nodes)
from smartstage.graph.view import GraphView
from smartstage.protos import StageDef
from tests.builder import G, N


def chain():
    #   a --> b --> c        d (alone)
    return G(N("a", "Const", dtype=tf.float32, value=1.0),
             N("b", "Identity", ["a"], T=tf.float32),
             N("c", "Identity", ["b"], T=tf.float32),
             N("d", "NoOp"))


def shape(graph_def):
    """(name, inputs, device) per node, in order: what the expected results spell out."""
    return [(n.name, list(n.input), n.device) for n in graph_def.node]


def identity(name, source):
    return N(name, "Identity", [source], T=tf.float32)


FLOAT = attr_value_pb2.AttrValue(type=tf.float32.as_datatype_enum)
INT = attr_value_pb2.AttrValue(type=tf.int32.as_datatype_enum)

CASES = [
    ("add at the end", [AddNode(identity("n", "c"))],
     [("a", [], ""), ("b", ["a"], ""), ("c", ["b"], ""), ("d", [], ""), ("n", ["c"], "")]),
    ("add before and after", [AddNode(identity("n", "a"), before="b"), AddNode(N("m", "NoOp"), after="c")],
     [("a", [], ""), ("n", ["a"], ""), ("b", ["a"], ""), ("c", ["b"], ""), ("m", [], ""), ("d", [], "")]),
    ("set inputs, data and control", [SetInputs("c", ("a", "^d"))],
     [("a", [], ""), ("b", ["a"], ""), ("c", ["a", "^d"], ""), ("d", [], "")]),
    ("set device", [SetDevice("b", "/device:CPU:0")],
     [("a", [], ""), ("b", ["a"], "/device:CPU:0"), ("c", ["b"], ""), ("d", [], "")]),
    ("remove", [SetInputs("c", ("a",)), RemoveNode("b")],
     [("a", [], ""), ("c", ["a"], ""), ("d", [], "")]),
    ("move to the end", [MoveToEnd("a")],
     [("b", ["a"], ""), ("c", ["b"], ""), ("d", [], ""), ("a", [], "")]),
    ("an added node edited later", [AddNode(identity("n", "a")), SetInputs("n", ("b",)), SetDevice("n", "/cpu:0")],
     [("a", [], ""), ("b", ["a"], ""), ("c", ["b"], ""), ("d", [], ""), ("n", ["b"], "/cpu:0")]),
    ("an input may name a node added later", [SetInputs("c", ("n",)), AddNode(identity("n", "a"))],
     [("a", [], ""), ("b", ["a"], ""), ("c", ["n"], ""), ("d", [], ""), ("n", ["a"], "")]),
]


@pytest.mark.parametrize("edits, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("with_view", [False, True])
def test_each_edit_kind(edits, expected, with_view):
    graph_def = chain()
    before = graph_def.SerializeToString()
    new = apply_to_graph_def(graph_def, edits, GraphView(graph_def) if with_view else None)
    assert shape(new) == expected
    assert graph_def.SerializeToString() == before  # the input is never edited


def test_set_attr_sets_and_removes():
    new = apply_to_graph_def(chain(), [SetAttr("b", "T", INT), SetAttr("c", "T", None),
                                       SetAttr("d", "_stream_id", attr_value_pb2.AttrValue(i=2))])
    nodes = {n.name: n for n in new.node}
    assert nodes["b"].attr["T"] == INT
    assert "T" not in nodes["c"].attr
    assert nodes["d"].attr["_stream_id"].i == 2


def test_add_function_goes_to_the_library():
    function = function_pb2.FunctionDef()
    function.signature.name = "f"
    new = apply_to_graph_def(chain(), [AddFunction(function)])
    assert [f.signature.name for f in new.library.function] == ["f"]


def test_stage_defs_after_replaces_by_name_and_appends_new_ones():
    old = [StageDef(name="s", num_threads=1)]
    edits = [SetStageDef(StageDef(name="s", num_threads=2)), SetStageDef(StageDef(name="t"))]
    assert stage_defs_after(old, edits) == [StageDef(name="s", num_threads=2), StageDef(name="t")]
    assert old == [StageDef(name="s", num_threads=1)]


BAD = [
    ("unknown node", [SetDevice("b", "/cpu:0"), SetInputs("zz", ("a",))], "edit 1 (SetInputs): the graph has no node 'zz'"),
    ("missing input", [SetInputs("c", ("a", "^gone"))], "node 'c' would read '^gone'"),
    ("duplicate added name", [AddNode(identity("n", "a")), AddNode(identity("b", "a"))],
     "edit 1 (AddNode): node 'b' is in the graph already"),
    ("anchor not in the graph", [AddNode(identity("n", "a"), before="zz")], "placed next to 'zz'"),
    ("edit of a removed node", [RemoveNode("d"), SetDevice("d", "")], "no node 'd' (removed by an earlier edit)"),
    ("added node reads a missing one", [AddNode(identity("n", "nowhere:1"))], "node 'n' would read 'nowhere:1'"),
]


@pytest.mark.parametrize("edits, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_edit_names_the_node_and_writes_nothing(edits, message):
    graph_def = chain()
    before = graph_def.SerializeToString()
    with pytest.raises(GraphError, match=re.escape(message)):
        apply_to_graph_def(graph_def, edits)
    assert graph_def.SerializeToString() == before


def test_log_answers_with_what_is_planned_so_far():
    graph_def = chain()
    log = EditLog(GraphView(graph_def))
    assert log.inputs_of("c") == ("b",) and log.device_of("b") == ""
    log.set_inputs("c", ["a", "^d"])
    log.set_device("b", "/cpu:0")
    log.set_attr("b", "T", INT)
    log.add_node(identity("b_1", "a"))
    assert log.inputs_of("c") == ("a", "^d")
    assert log.device_of("b") == "/cpu:0"
    assert log.attr_of("b", "T") == INT and log.attr_of("c", "T") == FLOAT
    assert log.unique_name("b") == "b_2" and log.unique_name("b") == "b_3"
    assert log.edits == (SetInputs("c", ("a", "^d")), SetDevice("b", "/cpu:0"), SetAttr("b", "T", INT),
                         AddNode(identity("b_1", "a")))
    assert touched_nodes(log.edits) == {"b", "c", "b_1"}


@pytest.mark.parametrize("inputs, drop_read, expected", [
    (["a", "^c", "b:1", "^c", "^a"], False, ["a", "b:1", "^c", "^a"]),
    (["a", "^c", "b:1", "^c", "^a"], True, ["a", "b:1", "^c"]),
    (["^x", "^x"], True, ["^x"]),
])
def test_dedupe_controls(inputs, drop_read, expected):
    assert dedupe_controls(inputs, drop_read=drop_read) == expected

