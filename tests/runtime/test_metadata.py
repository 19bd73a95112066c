"""Stage descriptions and targets live in the graph: they survive export_meta_graph / import_meta_graph."""

from __future__ import annotations

import tensorflow as tf

import smartstage.runtime as ss
from tests.runtime.helpers import bounded, drain, range_input


def _build_staged_graph() -> tf.Graph:
    #   range -> stage/put ~~ stage/take -> double (a marked target)
    graph = tf.Graph()
    with graph.as_default():
        x = ss.staged(range_input(5), capacity=2, num_threads=1, timeout_millis=700,
                      closed_exception_types=(tf.errors.OUT_OF_RANGE,))
        doubled = tf.multiply(x, 2, name="double")
        ss.mark_target_node(doubled)
    return graph


def test_stage_defs_survive_export_and_import():
    graph = _build_staged_graph()
    meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    assert meta.collection_def[ss.STAGES_COLLECTION].WhichOneof("kind") == "bytes_list"
    assert list(meta.collection_def[ss.TARGETS_COLLECTION].node_list.value) == ["double"]
    assert ss.stage_defs_from_meta_graph(meta) == ss.stage_defs(graph)

    imported = tf.Graph()
    with imported.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    assert ss.stage_defs(imported) == ss.stage_defs(graph)
    assert ss.target_node_names(imported) == ["double"]


def test_imported_graph_runs_with_the_hook():
    meta = tf.compat.v1.train.export_meta_graph(graph=_build_staged_graph())
    with tf.Graph().as_default() as imported:
        tf.compat.v1.train.import_meta_graph(meta)
        doubled = imported.get_tensor_by_name("double:0")
        got = []
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:
            while not sess.should_stop():
                got.append(sess.run(doubled, options=bounded()))
    assert got == [0, 2, 4, 6, 8]


def test_import_scope_prefixes_every_name():
    meta = tf.compat.v1.train.export_meta_graph(graph=_build_staged_graph())
    with tf.Graph().as_default() as imported:
        tf.compat.v1.train.import_meta_graph(meta, import_scope="tower")
        (stage,) = ss.stage_defs(imported)
        assert stage.name == "tower/stage"
        assert (stage.put_node, stage.take_node, stage.ready_put_node) == (
            "tower/stage/put", "tower/stage/take", "tower/stage/ready_put")
        assert stage.boundary_tensors == ["tower/IteratorGetNext:0"]
        assert ss.target_node_names(imported) == ["tower/double"]
        with tf.compat.v1.Session(graph=imported) as sess, ss.start_prefetch_threads(sess):
            assert drain(sess, imported.get_tensor_by_name("tower/double:0")) == [0, 2, 4, 6, 8]


def test_export_scope_strips_names_and_drops_stages_outside_it():
    graph = tf.Graph()
    with graph.as_default():
        with tf.name_scope("tower"):
            ss.staged(tf.constant(1), name="inner")
        ss.staged(tf.constant(2), name="outer")
    meta = tf.compat.v1.train.export_meta_graph(graph=graph, export_scope="tower")
    (stage,) = ss.stage_defs_from_meta_graph(meta)
    assert (stage.name, stage.put_node) == ("inner", "inner/put")


def test_graph_def_keeps_the_guard_without_any_python_state():
    # A bare GraphDef loses collections but keeps the in-graph guard: a take still fails clearly.
    graph_def = _build_staged_graph().as_graph_def()
    with tf.Graph().as_default() as imported:
        tf.graph_util.import_graph_def(graph_def, name="")
        assert ss.stage_defs(imported) == []
        with tf.compat.v1.Session(graph=imported) as sess:
            try:
                sess.run("double:0", options=bounded())
                raise AssertionError("the take ran without prefetch threads")
            except tf.errors.InvalidArgumentError as error:
                assert "make_prefetch_hook()" in error.message


def test_raw_bytes_in_the_collection_are_read():
    graph = _build_staged_graph()
    (stage,) = ss.stage_defs(graph)
    other = tf.Graph()
    other.add_to_collection(ss.STAGES_COLLECTION, stage.SerializeToString())
    assert ss.stage_defs(other) == [stage]
