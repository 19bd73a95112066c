"""multi_stream: `_stream_id` on every prefetch-side node and the put, never on the main side."""

from __future__ import annotations

import tensorflow as tf

from smartstage.config.options import enable_smart_stage
from smartstage.graph.view import GraphView
from smartstage.optimizer import optimize
from smartstage.graph.stages import find_stages
from smartstage.passes.gpu.placement import COPY_SCOPE
from smartstage.passes.gpu.multi_stream import STREAM_ATTR
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from tests.builder import G, N, node
from tests.passes.gpu.test_placement import GPU0, model_graph, stage_ops

# Streams of stages kept with their lanes (a folded stage has no prefetch side of ours to tag).
STREAMS = enable_smart_stage(stage_multi_stream=True, tf_data_stage="lanes")
STREAMS_GPU = enable_smart_stage(do_smart_stage_gpu=True, stage_multi_stream=True, tf_data_stage="lanes")


def stream_ids(graph_def) -> dict[str, int]:
    return {n.name: n.attr[STREAM_ATTR].i for n in graph_def.node if STREAM_ATTR in n.attr}


def report(result):
    return next(r for r in result.reports if r.name == "multi_stream")


def test_hand_graph_without_stage_def_gets_stream_zero_on_the_prefetch_side_and_the_put():
    result = optimize(model_graph(), STREAMS, targets=["loss"])
    ids = stream_ids(result.graph_def)
    assert ids == {"rows": 0, "hash": 0, "dense": 0, "scaled": 0, "shape": 0, "stage/put": 0}
    streams = result.extra["multi_stream"]["stage"]
    assert streams.source == "default" and streams.stream_id == 0
    # "two" is read by both sides: its kernels belong to the step as much as to the prefetch run.
    assert ("two", "the main side evaluates it too") in streams.skipped
    assert report(result).changed
    assert any("stock TensorFlow ignores it" in line for line in report(result).summary)


def test_with_the_gpu_pass_the_prefetch_copy_of_a_shared_constant_is_tagged():
    result = optimize(model_graph(), STREAMS_GPU, targets=["loss"])
    ids = stream_ids(result.graph_def)
    assert ids[f"stage/{COPY_SCOPE}/two"] == 0
    assert "two" not in ids


def test_a_stream_id_on_the_put_is_used_when_there_is_no_stage_def():
    g = model_graph()
    node(g, "stage/put").attr[STREAM_ATTR].i = 5
    result = optimize(g, STREAMS, targets=["loss"])
    ids = stream_ids(result.graph_def)
    assert set(ids.values()) == {5}
    assert result.extra["multi_stream"]["stage"].source == "put attribute"


def test_staged_stream_id_tags_exactly_the_prefetch_side():
    from smartstage.runtime import staged

    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(["a", "b"]).batch(1))
        f = staged(tf.strings.to_hash_bucket_fast(it.get_next(), 5), stage_subgraph_stream_id=2)
        w = tf.compat.v1.get_variable("w", [5, 1])
        loss = tf.reduce_sum(tf.gather(w, f + 1))
        meta = tf.compat.v1.train.export_meta_graph()
    result = optimize(meta, STREAMS, targets=[loss.op.name])
    out = GraphView(result.graph_def)
    stages, _ = find_stages(out)
    sides = prefetch_sides(out, stages)
    expected = {n for n in sides.side["stage"] if n not in sides.shared} | {"stage/put"}
    ids = stream_ids(result.graph_def)
    assert set(ids) == expected
    assert set(ids.values()) == {2}
    assert "add" in ids  # f + 1 moved to the prefetch side, and is tagged
    assert "stage/take" not in ids and "stage/buffer" not in ids and "GatherV2" not in ids


def test_a_node_on_two_stages_with_different_streams_is_not_tagged():
    #   seed -> a/put ~~ a/take -> ...        seed -> b/put ~~ b/take -> ...   (seed feeds both puts)
    s = tf.string
    g = G(
        N("seed", "Placeholder", dtype=s),
        *stage_ops("a", inputs=["seed"]), *stage_ops("b", inputs=["seed"]),
        N("w", "VariableV2", dtype=s, shape=[]),
        N("ja", "StringJoin", ["a/take", "w"], N=2), N("jb", "StringJoin", ["b/take", "w"], N=2),
    )
    node(g, "a/put").attr[STREAM_ATTR].i = 1
    node(g, "b/put").attr[STREAM_ATTR].i = 2
    result = optimize(g, STREAMS, targets=["ja", "jb"])
    ids = stream_ids(result.graph_def)
    assert "seed" not in ids
    skipped = dict(result.extra["multi_stream"]["a"].skipped)
    assert "streams [1, 2]" in skipped["seed"]


def test_tagging_twice_changes_nothing():
    once = optimize(model_graph(), STREAMS, targets=["loss"])
    twice = optimize(once.graph_def, STREAMS, targets=["loss"])
    assert not report(twice).changed
    assert twice.graph_def == once.graph_def
    assert twice.extra["multi_stream"]["stage"].already == len(stream_ids(once.graph_def))


def test_main_side_is_never_tagged():
    result = optimize(model_graph(main=GPU0), STREAMS_GPU, targets=["loss"])
    ids = stream_ids(result.graph_def)
    for name in ("lookup", "flat", "mix", "total", "loss", "w", "stage/take", "stage/buffer", "stage/close"):
        assert name not in ids
