"""The TensorBoard logdir: two runs, before and after, each holding its graph.

Read back with TensorFlow's event reader (tf.compat.v1.train.summary_iterator) and, where the
`tensorboard` package is installed (the test extra), with TensorBoard's own multiplexer and Graphs plugin.
"""

from __future__ import annotations

import glob
import os

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import smartstage as ss
from smartstage.inspection.render.tensorboard import write_tensorboard
from tests.inspection.graphs import deeprec_example, tiny_graph


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    meta = deeprec_example(tmp_path_factory.mktemp("deeprec"))
    result = ss.optimize(meta, ss.enable_smart_stage())
    path = tmp_path_factory.mktemp("logs")
    runs = write_tensorboard(meta, result.meta_graph_def, path)
    return path, runs, meta, result


def graph_events(run_dir):
    graphs, metas = [], 0
    for events in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(events):
            if event.HasField("graph_def"):
                graphs.append(graph_pb2.GraphDef.FromString(event.graph_def))
            metas += event.HasField("meta_graph_def")
    return graphs, metas


def test_both_graphs_read_back(logdir):
    path, runs, meta, result = logdir
    assert [os.path.basename(r) for r in runs] == ["before", "after"]
    [before], metas = graph_events(path / "before")
    assert before == meta.graph_def and metas == 1
    [after], _ = graph_events(path / "after")
    assert after == result.graph_def
    assert after != before


def test_a_bare_graph_def(tmp_path):
    result = ss.optimize(tiny_graph(), ss.enable_smart_stage())
    write_tensorboard(result.original_graph_def, result.graph_def, tmp_path)
    [after], metas = graph_events(tmp_path / "after")
    assert after == result.graph_def and metas == 0


def test_tensorboard_graph_dashboard_lists_both_runs(logdir):
    pytest.importorskip("tensorboard")
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.graph import graphs_plugin

    path, _, meta, result = logdir
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(path))
    plugin = graphs_plugin.GraphsPlugin(base_plugin.TBContext(data_provider=provider, multiplexer=multiplexer,
                                                              logdir=str(path)))
    info = plugin.info_impl(context.RequestContext(), experiment="")
    assert {run: value["run_graph"] for run, value in info.items()} == {"before": True, "after": True}
    body, mime = plugin.graph_impl(context.RequestContext(), "after", tag=None, is_conceptual=False, experiment="")
    payload = body.encode() if isinstance(body, str) else body
    assert mime == "text/x-protobuf" and b"stage/put" in payload
