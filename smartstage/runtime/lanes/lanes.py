"""Ordered lanes: the prefetch side of a stage split into a serial *head* and a parallel *body*.

    before:  k threads run  put(body(head()))  at once     -> batches reach the buffer in any order
    after:   head (serial, ticket n)  ->  body on lane n's thread  ->  lane queue  ->  merger (ticket order)

The *head* is every op of the prefetch side whose result depends on how often or in which order it
runs: input ops (IteratorGetNext, queue dequeues, reader reads), random ops, anything else stateful
(a py_func, a variable read), with everything upstream of them and anything tied to them by a control
edge. It runs once per batch, under one lock, so batch n is always the n-th result of the input. The
*body* is the rest (stateless ops, read-only table lookups, Asserts): it runs on several lane threads
at once. The head's run fetches the values the body reads (the split's cut); the lane's body run feeds
them to the original body ops and enqueues the batch into the lane's one-batch FIFO queue
(`lane_<i>/enqueue`), and one merger thread moves ticket 0, 1, 2, ... from the lane queues into the
stage's buffer (`lane_<i>/move`: dequeue -> enqueue, in the graph, no Python copy).

Nothing of the user's graph is edited: the split is computed from the live tf.Graph when the prefetch
threads start, and the lane ops are added next to the stage (under `<stage>/lanes`), built from the
put's inputs as they are then (after any rewrite). A finalized graph without lanes gets none, and the
stage runs one ordered thread. Lanes on input tasks (runtime/lanes/remote.py) fetch and feed the head's
values the same way; their bodies are the optimizer's copies, placed per task.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.python.ops import gen_data_flow_ops

from smartstage.graph.stage_names import (BATCH_BYTES, HEAD_TARGETS, LANE_DISCARD, LANE_ENQUEUE, LANE_MOVE,
                                          LANE_OCCUPANCY, LANE_SIZE, LANES_SCOPE, PUT_OCCUPANCY, LaneNames,
                                          lane_scope)
from smartstage.runtime.stage.settings import StageSettings
from smartstage.runtime.lanes.batch_bytes import bytes_of_batch
from smartstage.runtime.lanes.split import PrefetchSplit, split_prefetch_side

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lane:
    """The ops of one lane: its queue, the body's enqueue into it, and the move into the stage buffer."""

    enqueue: tf.Operation
    move: tf.Operation
    occupancy: tf.Tensor     # the stage buffer's size right after this lane's move
    size: tf.Tensor          # batches waiting in this lane's queue
    discard: tf.Operation    # dequeues one batch and drops it (re-initialisation)


@dataclass(frozen=True)
class LaneGraph:
    """Everything the ordered producer of one stage runs besides the put itself."""

    split: PrefetchSplit
    lanes: tuple[Lane, ...]
    head_targets: tf.Operation | None  # a NoOp waiting for split.head_targets (some are not fetchable)
    batch_bytes: tf.Tensor | None     # bytes of one batch (the put's inputs), computed by the body run
    put_occupancy: tf.Tensor | None   # the buffer's size right after the put (one-thread path)
    put_inputs: tuple[str, ...]


def find_lane(graph: tf.Graph, scope: str, index: int) -> Lane:
    """Lane `index` as built under `scope` (by build_lane); KeyError when it was not built."""
    names = LaneNames.of(scope, index)
    return Lane(graph.get_operation_by_name(names.enqueue), graph.get_operation_by_name(names.move),
                graph.get_tensor_by_name(names.occupancy), graph.get_tensor_by_name(names.size),
                graph.get_operation_by_name(names.discard))


def found_lane_graph(graph: tf.Graph, scope: str, split: PrefetchSplit, lanes: list[Lane],
                     put_inputs: tuple[str, ...]) -> LaneGraph:
    """The LaneGraph of `lanes` found under `scope`, with the scope's own ops (head targets, bytes, occupancy)."""
    targets = graph.get_operation_by_name(f"{scope}/{HEAD_TARGETS}") if split.head_targets else None
    return LaneGraph(split, tuple(lanes), targets, graph.get_tensor_by_name(f"{scope}/{BATCH_BYTES}:0"),
                     graph.get_tensor_by_name(f"{scope}/{PUT_OCCUPANCY}:0"), put_inputs)


def _existing(graph: tf.Graph, scope: str, put: tf.Operation, count: int) -> LaneGraph | None:
    """Lanes built earlier for the same put inputs (a second session on this graph), if any."""
    try:
        marker = graph.get_operation_by_name(LaneNames.of(scope, 0).enqueue)
    except KeyError:
        return None
    inputs = tuple(t.name for t in put.inputs[1:])
    if tuple(t.name for t in marker.inputs[1:]) != inputs:
        return None
    lanes = []
    for index in range(count):
        try:
            lanes.append(find_lane(graph, scope, index))
        except KeyError:
            break
    return found_lane_graph(graph, scope, split_prefetch_side(put), lanes, inputs)


def build_lane(index: int, buffer: tf.Tensor, values: list[tf.Tensor], waits: list[tf.Operation],
               scope: str | None = None) -> Lane:
    """Lane `index`'s ops under `lane_<index>/` of the current name scope (or the absolute `scope`): a
    one-batch FIFO the body's run fills with `values` (after `waits`), and the merger's move from it into
    the stage's `buffer`."""
    dtypes = [t.dtype.base_dtype for t in values]
    shapes = [t.shape for t in values]
    with tf.compat.v1.name_scope(scope or lane_scope(index)):
        queue = gen_data_flow_ops.fifo_queue_v2(
            component_types=dtypes, shapes=shapes if all(s.is_fully_defined() for s in shapes) else [],
            capacity=1, name="queue")
        with tf.control_dependencies(waits):
            enqueue = gen_data_flow_ops.queue_enqueue_v2(queue, values, name=LANE_ENQUEUE)
        taken = gen_data_flow_ops.queue_dequeue_v2(queue, component_types=dtypes, name="dequeue")
        taken = list(taken) if isinstance(taken, (list, tuple)) else [taken]
        move = gen_data_flow_ops.queue_enqueue_v2(buffer, taken, name=LANE_MOVE)
        with tf.control_dependencies([move]):
            occupancy = gen_data_flow_ops.queue_size_v2(buffer, name=LANE_OCCUPANCY)
        size = gen_data_flow_ops.queue_size_v2(queue, name=LANE_SIZE)
        discard = gen_data_flow_ops.queue_dequeue_v2(queue, component_types=dtypes, name=LANE_DISCARD)
        discard = (discard[0] if isinstance(discard, (list, tuple)) else discard).op
    return Lane(enqueue, move, occupancy, size, discard)


def lane_graph(graph: tf.Graph, stage_name: str, put: tf.Operation, buffer: tf.Tensor,
               count: int) -> tuple[LaneGraph | None, str]:
    """The lane ops of a stage (built now if the graph is not finalized); (None, why) when there are none.

        before:  stage/put(buffer, a, b)
        after:   stage/lanes/lane_<i>/{queue, enqueue(a, b), move, occupancy, size, discard}, stage/lanes/batch_bytes
    """
    base = f"{stage_name}/{LANES_SCOPE}"
    found = _existing(graph, base, put, count)
    if found is not None and len(found.lanes) >= count:
        return found, ""
    if graph.finalized:
        return None, ("the graph is finalized and has no lanes for this stage; build the session through "
                      "smartstage.make_prefetch_hook() (its begin() builds them) or start the prefetch threads "
                      "before finalizing")
    components = list(put.inputs[1:])
    split = split_prefetch_side(put)
    with graph.as_default(), tf.compat.v1.name_scope(None):
        scope = graph.unique_name(base, mark_as_used=False)
        with tf.compat.v1.name_scope(scope + "/"), tf.device(put.device):
            waits = [c for c in put.control_inputs if c.name not in split.head_ops]
            lanes = [build_lane(index, buffer, components, waits) for index in range(count)]
            targets = tf.group(*split.head_targets, name=HEAD_TARGETS) if split.head_targets else None
            batch_bytes = tf.identity(bytes_of_batch(components), name=BATCH_BYTES)
            with tf.control_dependencies([put]):
                put_occupancy = gen_data_flow_ops.queue_size_v2(buffer, name=PUT_OCCUPANCY)
    logger.debug("stage %s: built %d lanes under %s (head %d ops, %d cut tensors)",
                 stage_name, count, scope, len(split.head_ops), len(split.cut))
    return LaneGraph(split, tuple(lanes), targets, batch_bytes, put_occupancy,
                     tuple(t.name for t in components)), ""


def discard_leftovers(control_run, lanes) -> None:
    """Drops batches left in lane queues by a stop (re-initialisation): they belong to the old input."""
    for lane in lanes:
        for _ in range(int(control_run(lane.size))):
            control_run(lane.discard)


def autotune_max_threads() -> int:
    """Lanes built for a stage whose num_threads is AUTOTUNE: two per core, 2 to 8."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def lane_count(settings: StageSettings) -> int:
    """How many lanes a stage needs: none when it runs one ordered thread or is unordered.

        before:  StageSettings(num_threads=1, tune_num_threads=True, ordered=True, ...)   on a 2-core machine
        after:   4 (autotune_max_threads(): the tuner may try up to 4)
    """
    if not settings.ordered:
        return 0
    if settings.tune_num_threads:
        return autotune_max_threads()
    return settings.num_threads if settings.num_threads > 1 else 0


def prepare_lanes(graph: tf.Graph, stages) -> None:
    """Builds the lane ops of every stage that needs them, while the graph can still grow
    (the prefetch hook's begin(), before MonitoredTrainingSession finalizes the graph)."""
    for stage_def in stages:
        count = lane_count(StageSettings.from_def(stage_def))
        if count and not graph.finalized:
            put = graph.get_operation_by_name(stage_def.put_node)
            lane_graph(graph, stage_def.name, put, put.inputs[0], count)
