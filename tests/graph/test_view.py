"""GraphView and the tensor-name parser on a hand-drawn graph, with every expected answer written out."""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.errors import GraphError
from smartstage.graph.names import CONTROL_PORT, TensorName, input_string, parse_tensor_name
from smartstage.graph.view import GraphView
from tests.builder import G, N


def diamond():
    #   a --> b:0 --> d
    #    \--> c ----/      and ^a -> d (control)
    return G(N("a", "Const", dtype=tf.float32, value=1.0),
             N("b", "Identity", ["a"], T=tf.float32),
             N("c", "Identity", ["a:0"], T=tf.float32),
             N("d", "AddV2", ["b", "c", "^a"], T=tf.float32))


@pytest.mark.parametrize("text, expected", [
    ("x", TensorName("x", 0)), ("x:3", TensorName("x", 3)), ("^x", TensorName("x", CONTROL_PORT)),
    ("scope/x:10", TensorName("scope/x", 10)),
])
def test_parse_tensor_name(text, expected):
    assert parse_tensor_name(text) == expected


def test_an_empty_name_is_a_graph_error():
    with pytest.raises(GraphError, match="empty tensor name"):
        parse_tensor_name("")


def test_input_strings_write_port_zero_bare():
    assert [input_string("x", 0), input_string("x", 2), input_string("x", CONTROL_PORT)] == ["x", "x:2", "^x"]


def test_inputs_fanouts_and_order():
    view = GraphView(diamond())
    assert view.data_inputs("d") == [TensorName("b", 0), TensorName("c", 0)]
    assert view.control_inputs("d") == ["a"]
    assert sorted(f.consumer for f in view.fanouts("a")) == ["b", "c", "d"]
    assert view.consumers("b") == ["d"]
    assert view.topological_order() == ["a", "b", "c", "d"]
    assert view.ancestors(["d"]) >= {"a", "b", "c"}
    assert view.output_dtypes("d") == [tf.float32.as_datatype_enum]


def test_a_cycle_and_a_dangling_input_are_named():
    cyc = G(N("p", "Identity", ["q"], T=tf.float32), N("q", "Identity", ["p"], T=tf.float32))
    with pytest.raises(GraphError, match="cycle"):
        GraphView(cyc).check_acyclic()
    with pytest.raises(GraphError, match="'missing'"):
        GraphView(G(N("p", "Identity", ["missing"], T=tf.float32))).check_inputs()
