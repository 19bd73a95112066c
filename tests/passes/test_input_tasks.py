"""The input_tasks pass on the scale-out test graph (no cluster needed): what goes where, and the options."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.errors import ConfigError
from tests.cluster import graphs

TASK0 = "/job:input/replica:0/task:0/device:CPU:0"
TASK1 = "/job:input/replica:0/task:1/device:CPU:0"


def optimized(mode: str = "central", tasks: int = 2, **build):
    graph = tf.Graph()
    with graph.as_default():
        names = graphs.build(**build)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input", input_tasks=tasks, input_mode=mode)
    result = ss.optimize(meta, config, targets=[names["loss"], names["rows"], names["train_op"]])
    return result, {n.name: n for n in result.graph_def.node}


def test_central_places_the_body_on_task_0_copies_it_per_task_and_keeps_the_head_and_buffer():
    result, nodes = optimized()
    (report,) = [r for r in result.reports if r.name == "input_tasks"]
    plan = report.details["stage"]
    assert report.changed and plan.head == ("IteratorGetNext",)
    assert {nodes[n].device for n in plan.body} == {TASK0}
    assert all(nodes[f"stage/input_task_1/{n}"].device == TASK1 for n in plan.body)
    assert "stage/input_task_2/Sqrt" not in nodes
    assert nodes["IteratorGetNext"].device == "" and "input" not in nodes["stage/put"].device
    assert set(plan.cut) == {"IteratorGetNext:0", "IteratorGetNext:1", "IteratorGetNext:2"}
    # a copy reads the copies of its body inputs and the trainer's head outputs as they are
    sqrt = nodes["stage/input_task_1/Sqrt"]
    assert all(i.startswith("stage/input_task_1/") for i in sqrt.input)
    marker = nodes["stage/input_tasks"]
    assert [s.decode() for s in marker.attr["_smartstage_input_tasks"].list.s] == [TASK0, TASK1]
    diff = result.diff()
    assert {c.name: c.after for c in diff.device_changes}["Sqrt"] == TASK0
    assert "stage/input_task_1/Sqrt" in {a.name for a in diff.added}


def test_sharded_shards_the_source_of_every_task_and_initializes_them_together():
    _, nodes = optimized("sharded")
    assert nodes["RangeDataset/input_shard"].op == "ShardDataset"
    assert nodes["stage/input_task_1/RangeDataset/input_shard/index"].attr["value"].tensor.int64_val == [1]
    assert "RangeDataset/input_shard" in nodes["MapDataset"].input
    assert "^stage/input_task_1/MakeIterator" in nodes["MakeIterator"].input
    assert nodes["stage/input_task_1/IteratorGetNext"].device == TASK1


def test_optimizing_twice_changes_nothing_the_second_time():
    result, _ = optimized()
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input", input_tasks=2)
    again = ss.optimize(result.meta_graph_def, config, targets=["loss", "rows_seen", "train_op"])
    (report,) = [r for r in again.reports if r.name == "input_tasks"]
    assert not report.changed and "already placed" in report.summary[0]


def test_options_both_spellings_and_the_task_count_from_the_cluster_def():
    config = tf.compat.v1.ConfigProto()
    job = config.cluster_def.job.add(name="input")
    for i in range(3):
        job.tasks[i] = f"127.0.0.1:{2000 + i}"
    ss.enable_smart_stage(config, input_job="input", input_mode="sharded")
    options = ss.options_from_config(config)
    assert (options.input_job, options.input_tasks, options.input_mode) == ("input", 3, "sharded")
    with pytest.raises(ConfigError, match="input_tasks"):
        ss.options_from_config(ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_job="input"))
    with pytest.raises(ConfigError, match="input_mode"):
        ss.options_from_config(None, input_job="input", input_tasks=1, input_mode="nearby")


def test_cli_flag(tmp_path):
    from smartstage.cli.main import main

    graph = tf.Graph()
    with graph.as_default():
        graphs.build()
        tf.compat.v1.train.export_meta_graph(str(tmp_path / "in.meta"), graph=graph)
    assert main(["optimize", str(tmp_path / "in.meta"), "-o", str(tmp_path / "out.meta"), "--input-job", "input",
                 "--input-tasks", "2", "--target", "loss", "--target", "rows_seen"]) == 0
    meta = tf.compat.v1.MetaGraphDef()
    meta.ParseFromString((tmp_path / "out.meta").read_bytes())
    assert any(n.name == "stage/input_task_1/Sqrt" for n in meta.graph_def.node)
