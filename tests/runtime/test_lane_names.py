"""The lanes' op names are spelled once (graph/stage_names.py): what lane_graph builds, a second lane_graph on the
same graph finds again by those names (a second session).

    range -> GetNext -> x*2 -> put ~~ take
"""

from __future__ import annotations

import tensorflow as tf

import smartstage.runtime as ss
from smartstage.graph.stage_names import LaneNames
from smartstage.runtime.lanes.lanes import find_lane, lane_graph
from smartstage.runtime.stage.metadata import stage_defs
from tests.runtime.helpers import range_input


def test_lanes_built_once_are_found_again_by_their_names(graph):
    ss.staged([tf.identity(range_input(4) * 2, name="double")], num_threads=2, capacity=2)
    put = graph.get_operation_by_name(next(iter(stage_defs(graph))).put_node)
    built, why = lane_graph(graph, "stage", put, put.inputs[0], 2)
    assert why == "" and len(built.lanes) == 2 and built.lanes[0] != built.lanes[1]  # one queue per lane
    for index, lane in enumerate(built.lanes):
        names = LaneNames.of("stage/lanes", index)
        assert (lane.enqueue.name, lane.move.name, lane.occupancy.name, lane.size.name, lane.discard.name) == (
            names.enqueue, names.move, names.occupancy, names.size, names.discard)
        assert [t.name for t in lane.enqueue.inputs[1:]] == [t.name for t in put.inputs[1:]]  # the body's own ops
    ops_before = len(graph.get_operations())
    found, why = lane_graph(graph, "stage", put, put.inputs[0], 2)
    assert why == "" and len(graph.get_operations()) == ops_before  # nothing built the second time
    assert found.lanes == built.lanes and found.batch_bytes is built.batch_bytes
    assert found.put_occupancy is built.put_occupancy and found.head_targets is built.head_targets
    assert find_lane(graph, "stage/lanes", 1) == built.lanes[1]
