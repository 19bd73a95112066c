"""optimize()'s arguments are checked at the boundary: one name or tensor is one target; a missing output
port, a wrong type or an unknown keyword is a project error naming the argument and what it accepts."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss
from tests.inspection.graphs import tiny_graph

ON = ss.enable_smart_stage()


def test_a_single_name_is_one_target():
    result = ss.optimize(tiny_graph(), ON, targets="loss")
    assert result.targets == {"loss"}
    assert "loss" in result.partitions[0].pinned
    with pytest.raises(ss.TargetError, match=r"'zsum' names no node"):  # not 'z', 's', 'u', 'm'
        ss.optimize(tiny_graph(), ON, targets="zsum")


def test_tensors_and_operations_are_targets():
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(tiny_graph(), name="")
    upper, hashed = graph.get_tensor_by_name("upper:0"), graph.get_operation_by_name("hash")
    for targets, expected in ((upper, {"upper"}), (hashed, {"hash"}), ([upper, hashed], {"upper", "hash"})):
        result = ss.optimize(tiny_graph(), ON, targets=targets)
        assert result.targets == expected
        assert expected <= set(result.partitions[0].pinned)


@pytest.mark.parametrize("targets, match", [
    (5, r"targets=5 \(int\).*name.*tf.Tensor"),
    (["loss", 3.5], r"targets holds 3.5 \(float\)"),
])
def test_a_target_of_another_type_is_refused(targets, match):
    with pytest.raises(ss.ConfigError, match=match):
        ss.optimize(tiny_graph(), ON, targets=targets)


def test_a_missing_output_port_is_refused():
    with pytest.raises(ss.TargetError, match=r"target 'loss:7': node 'loss' \(Sum\) has 1 output.*no output 7"):
        ss.optimize(tiny_graph(), ON, targets=["loss:7"])
    with pytest.raises(ss.TargetError, match=r"feed 'take:3': node 'take' \(QueueDequeueV2\) has 1 output"):
        ss.optimize(tiny_graph(), ON, feeds="take:3")


def test_an_unknown_keyword_is_refused_with_the_accepted_ones():
    with pytest.raises(ss.ConfigError, match=r"unknown keyword argument\(s\) \['gpu'\].*'do_smart_stage_gpu'"):
        ss.optimize(tiny_graph(), ON, gpu=True)


def test_a_node_without_outputs_is_a_target_by_its_name():
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(tiny_graph(), name="")
        tf.no_op(name="step")
    result = ss.optimize(graph.as_graph_def(), ON, targets="step")
    assert "step" in result.targets
