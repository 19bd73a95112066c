"""The drawing: clusters, highlighted moves, boundary label; DOT source; built-in SVG; collapse of a 100k-node graph."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.inspection.render.dot import GraphvizMissing, dot_source, dot_to_svg, graphviz_available
from smartstage.inspection.render.drawing import build_drawing
from smartstage.inspection.render.svg import svg_drawing
from tests.builder import G, N
from tests.inspection.graphs import tiny_graph

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def tiny_diff():
    return ss.optimize(tiny_graph(), ss.enable_smart_stage()).diff()


def test_drawing_of_the_tiny_graph(tiny_diff):
    d = build_drawing(tiny_diff)
    assert [c.side for c in d.clusters] == ["prefetch:q", "main"]
    by_label = {b.label: b for b in d.boxes}
    assert {"reader", "hash", "upper", "as_number", "put", "take", "lookup", "loss", "total", "w", "w/read"} <= set(by_label)
    assert "axis" not in by_label and "q" not in by_label, "free nodes and the buffer are on no side"
    assert by_label["hash"].moved == 1 and by_label["hash"].cluster == "cluster_prefetch_0"
    assert by_label["lookup"].pinned == 1 and by_label["lookup"].cluster == "cluster_main"
    [boundary] = [e for e in d.edges if e.boundary]
    assert (d.box(boundary.src).role, d.box(boundary.dst).role) == ("put", "take")
    assert boundary.label == "2 tensors: hash:0, as_number:0"
    assert not d.collapsed


def test_dot_source(tiny_diff):
    dot = dot_source(tiny_diff)
    assert dot.startswith("digraph smartstage {") and dot.rstrip().endswith("}")
    assert 'subgraph cluster_prefetch_0 {' in dot and 'label="prefetch side of stage \'q\'"' in dot
    assert "subgraph cluster_main {" in dot
    assert 'label="2 tensors: hash:0, as_number:0"' in dot and 'class="boundary"' in dot
    assert dot.count('class="box node moved"') == 3
    assert dot == dot_source(tiny_diff), "deterministic"


def test_builtin_svg(tiny_diff):
    svg = svg_drawing(tiny_diff)
    root = ET.fromstring(svg)
    boxes = [g for g in root.iter(SVG + "g") if "box" in g.get("class", "").split()]
    assert len(boxes) == len(build_drawing(tiny_diff).boxes)
    moved = [g for g in boxes if "moved" in g.get("class").split()]
    assert sorted(g.find(SVG + "title").text.split("\n")[0] for g in moved) == ["as_number", "hash", "upper"]
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "2 tensors:" in texts and "hash:0" in texts
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0


@pytest.mark.skipif(not graphviz_available(), reason="Graphviz 'dot' is not installed (apt-get install graphviz)")
def test_graphviz_layout(tiny_diff):
    svg = svg_drawing(tiny_diff, layout="graphviz")
    root = ET.fromstring(svg)
    ids = {g.get("id") for g in root.iter(SVG + "g")}
    assert {b.id for b in build_drawing(tiny_diff).boxes} <= ids, "box ids survive, so the HTML search works"


def test_graphviz_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        dot_to_svg("digraph {}")


def big_graph(scopes: int = 100, per_scope: int = 1000):
    #   reader -> put ~~ take -> hash -> model/block<i>/sub<j>/op<k> chains (100 x 1000 Identity nodes)
    g = G(N("reader", "Placeholder", dtype=tf.string),
          N("q", "FIFOQueueV2", component_types=[tf.string], shapes=[], capacity=2, shared_name="q"),
          N("put", "QueueEnqueueV2", ["q", "reader"], Tcomponents=[tf.string]),
          N("take", "QueueDequeueV2", ["q"], component_types=[tf.string]),
          N("hash", "StringToHashBucketFast", ["take"], num_buckets=10),
          N("w", "VariableV2", dtype=tf.float32, shape=[10, 4]))
    proto = N("x", "Identity", ["hash"], T=tf.int64)
    for s in range(scopes):
        previous = "hash"
        for k in range(per_scope):
            node = g.node.add()
            node.CopyFrom(proto)
            node.name = f"model/block{s}/sub{k // 100}/op{k}"
            node.input[0] = previous
            previous = node.name
        g.node.add().CopyFrom(N(f"train/use{s}", "AddV2", [previous, "w"], T=tf.int64))
    return g


def test_a_100k_node_graph_collapses_to_a_readable_page():
    result = ss.optimize(big_graph(), ss.enable_smart_stage())
    diff = result.diff()
    assert diff.after_nodes > 100_000
    drawing = build_drawing(diff, max_boxes=80)
    assert drawing.collapsed and len(drawing.boxes) <= 80 + 2
    assert sum(b.size for b in drawing.boxes) == drawing.drawn_nodes, "every drawn node is in exactly one box"
    assert any(b.label == "model/(other scopes)" for b in drawing.boxes)
    assert sum(b.moved for b in drawing.boxes) == len(diff.moved)
    svg = svg_drawing(diff, drawing=drawing)
    assert len(svg) < 200_000
    ET.fromstring(svg)
