"""The TF2 split's graph rewrites on hand-drawn graphs, with the results written out: the stand-ins
(replace_nodes) and the cut in two (cut)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.errors import GraphError
from smartstage.graph.rewrites import cut, replace_nodes
from tests.builder import G, N


def shape(graph_def):
    """(name, inputs) per node, in order."""
    return [(n.name, list(n.input)) for n in graph_def.node]


def captured():
    #   w(Placeholder) --> read(ReadVariableOp) --> loss        x(Placeholder) --> loss ; r(RandomUniform)
    return G(N("w", "Placeholder", dtype=tf.resource),
             N("x", "Placeholder", dtype=tf.float32),
             N("read", "ReadVariableOp", ["w", "^x"], dtype=tf.float32),
             N("r", "RandomUniform", ["x"], T=tf.int32, dtype=tf.float32),
             N("loss", "AddV2", ["read", "x:0"], T=tf.float32))


def test_replace_nodes_renames_replaces_and_adds_controls():
    g = captured()
    out = replace_nodes(g, [N("captured/w", "VarHandleOp", dtype=tf.float32),
                            N("read", "Const", ["^x"], dtype=tf.float32),
                            N("state", "VarHandleOp", dtype=tf.int64)],
                        {"w": "captured/w"}, {"r": ["state"]})
    # w is gone, read keeps its name under another op type (its own inputs as given), r waits for state.
    assert shape(out) == [("x", []), ("r", ["x", "^state"]), ("loss", ["read", "x:0"]),
                          ("captured/w", []), ("read", ["^x"]), ("state", [])]
    assert [n.op for n in out.node] == ["Placeholder", "RandomUniform", "AddV2", "VarHandleOp", "Const", "VarHandleOp"]
    assert shape(g)[0] == ("w", [])  # the input graph is not edited


def test_replace_nodes_points_readers_at_the_new_name():
    g = G(N("w", "Placeholder", dtype=tf.resource),
          N("read", "ReadVariableOp", ["w"], dtype=tf.float32),
          N("gather", "ResourceGather", ["w", "read:0", "^w"], dtype=tf.float32))
    out = replace_nodes(g, [N("captured/w", "VarHandleOp", dtype=tf.float32)], {"w": "captured/w"})
    assert shape(out) == [("read", ["captured/w"]), ("gather", ["captured/w", "read:0", "^captured/w"]),
                          ("captured/w", [])]


def test_replace_nodes_refuses_a_reader_of_a_missing_node_and_writes_nothing():
    with pytest.raises(GraphError, match="nope"):
        replace_nodes(captured(), [N("extra", "Identity", ["nope"], T=tf.float32)])


def test_cut_gives_each_side_what_it_needs():
    #   batch --> hash --> lookup(w) --> loss ;  moved: hash ; boundary: hash:0
    g = G(N("batch", "Placeholder", dtype=tf.int64),
          N("w", "Placeholder", dtype=tf.resource),
          N("hash", "Identity", ["batch"], T=tf.int64),
          N("lookup", "ResourceGather", ["w", "hash"], dtype=tf.float32, Tindices=tf.int64),
          N("loss", "Identity", ["lookup"], T=tf.float32))
    sides = cut(g, ("hash",), ("batch",), ("hash:0",), {})
    assert shape(sides.prefetch_graph_def) == [("batch", []), ("hash", ["batch"])]
    assert sides.main_inputs == ("smartstage/boundary/0",)
    assert shape(sides.main_graph_def) == [("w", []), ("lookup", ["w", "smartstage/boundary/0"]),
                                           ("loss", ["lookup"]), ("smartstage/boundary/0", [])]
    assert sides.prefetch_extra == ()
