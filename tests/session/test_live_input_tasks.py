"""The input-task placement written into the live graph (its edit log, session/live_edits.py), without a cluster.

    offline:  optimize(exported graph, input_job="input", input_tasks=2)  -> copies, shards, marker
    live:     prepare_graph(the built graph, the same options)             -> the same nodes, in the same tf.Graph

Each case builds tests/cluster/graphs.py twice (identical names) and compares every node the pass added or
re-pointed, offline vs live: op, device and inputs. Nothing runs; the cluster tests run it
(tests/cluster/test_session_flag.py).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.config.options import options_from_config
from smartstage.graph.names import parse_tensor_name
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.session.live_rewrite import placed_stages
from smartstage.session.session import prepare_graph
from tests.cluster import graphs

TASKS = 2


def _config(mode: str | None) -> tf.compat.v1.ConfigProto:
    if mode is None:
        return ss.enable_smart_stage(tf.compat.v1.ConfigProto())
    return ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input", input_tasks=TASKS, input_mode=mode)


def _offline(mode: str):
    with tf.Graph().as_default() as graph:
        names = graphs.build()
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    return ss.optimize(meta, _config(mode), targets=[names["loss"], names["rows"], names["train_op"]])


def _live(mode: str | None) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        names = graphs.build()
    prepare_graph(graph, options_from_config(_config(mode)), [names["loss"], names["rows"], names["train_op"]])
    return graph


def _node_key(node) -> tuple:
    return node.op, node.device, sorted(node.input)


@pytest.mark.parametrize("mode", ["central", "sharded"])
def test_the_live_graph_gets_every_node_the_pass_added_and_every_edge_it_moved(mode):
    result = _offline(mode)
    assert placed_stages(result), "the pass placed nothing: the test graph no longer has a body to place"
    original = {n.name for n in result.original_graph_def.node}
    added = {n.name for n in result.graph_def.node if n.name not in original
             and ("/input_task" in n.name or "/input_shard" in n.name)}
    repointed = {n.name for n in result.graph_def.node if n.name not in added
                 and any(parse_tensor_name(raw).node in added for raw in n.input)}
    live = {n.name: n for n in _live(mode).as_graph_def().node}
    offline = {n.name: n for n in result.graph_def.node}
    assert added and all(name in live for name in added), sorted(added - set(live))[:5]
    differ = [name for name in sorted(added | repointed) if _node_key(live[name]) != _node_key(offline[name])]
    assert not differ, [(name, _node_key(live[name]), _node_key(offline[name])) for name in differ[:3]]
    copies = [name for name in added if "/input_task_1/" in name]
    assert copies and {live[name].device for name in copies} == {"/job:input/replica:0/task:1/device:CPU:0"}
    if mode == "sharded":  # task 0's source read through its shard; the initializer runs task 1's copy too
        assert any(name.endswith("/input_shard") and "/input_task_" not in name for name in added)
        assert repointed


@pytest.mark.parametrize("mode", ["central", "sharded"])
def test_the_stage_runs_one_lane_per_task_at_least(mode):
    (stage,) = stage_defs(_live(mode))
    assert stage.num_threads == TASKS  # graphs.build() asks for one thread


def test_without_input_job_nothing_is_placed():
    graph = _live(None)
    assert not [op.name for op in graph.get_operations() if "/input_task" in op.name or "/input_shard" in op.name]
    assert not [op.device for op in graph.get_operations() if "/job:input" in op.device]


def test_the_session_flag_refuses_tfdata_service_with_the_offline_path_named():
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_mode="tf_data_service",
                                   tf_data_service="grpc://localhost:5050")
    with tf.Graph().as_default() as graph:
        names = graphs.build()
    with pytest.raises(ss.ConfigError, match="offline path only: optimize the exported graph"):
        prepare_graph(graph, options_from_config(config), [names["loss"]])
