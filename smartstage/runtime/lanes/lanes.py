"""Ordered lanes: the prefetch side of a stage split into a serial *head* and a parallel *body*.

    before:  k threads run  put(body(head()))  at once     -> batches reach the buffer in any order
    after:   head (serial, ticket n)  ->  body on lane n's thread  ->  lane queue  ->  merger (ticket order)

The *head* is every op of the prefetch side whose result depends on how often or in which order it
runs: input ops (IteratorGetNext, queue dequeues, reader reads), random ops, anything else stateful
(a py_func, a variable read), with everything upstream of them and anything tied to them by a control
edge. It runs once per batch, under one lock, so batch n is always the n-th result of the input. The
*body* is the rest (stateless ops, read-only table lookups, Asserts): it runs on several lane threads
at once. The head's run hands its values over inside TensorFlow (runtime/lanes/handoff.py): with shared
lanes (build_shared_lane) it stages them under the batch's ticket, every lane runs the one copy of the
ops that depend on the batch for its ticket into an output map, and one merger thread moves ticket 0, 1,
2, ... from there into the stage's buffer (`move`: unstage -> enqueue, in the graph, no Python copy).
Every run feeds its ticket, so k lanes share three executors and one body copy. Lanes that feed the
head's values (a body that cannot be copied) and lanes on input tasks have one small FIFO queue each
(`lane_<i>/enqueue`, `lane_<i>/move`).

Nothing of the user's graph is edited: the split is computed from the live tf.Graph when the prefetch
threads start, and the lane ops are added next to the stage (under `<stage>/lanes`), built from the
put's inputs as they are then (after any rewrite). A finalized graph without lanes gets none, and the
stage runs one ordered thread. Lanes on input tasks (runtime/lanes/remote.py) still fetch and feed the head's
values: their body copies are the optimizer's, placed per task.
"""

from __future__ import annotations

import dataclasses
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
from smartstage.runtime.lanes.handoff import body_to_copy, build_keyed_hand_off, copy_refusal
from smartstage.runtime.lanes.split import PrefetchSplit, split_prefetch_side

logger = logging.getLogger(__name__)

TICKET = "ticket"        # shared lanes' placeholder of the batch's ticket (lane_0/ticket)



@dataclass(frozen=True)
class Lane:
    """The ops of one lane: its queue, the body's enqueue into it, and the move into the stage buffer."""

    enqueue: tf.Operation
    move: tf.Operation
    occupancy: tf.Tensor     # the stage buffer's size right after this lane's move
    size: tf.Tensor          # batches waiting in this lane's queue
    discard: tf.Operation    # dequeues one batch and drops it (re-initialisation)
    # Shared lanes only (None: the head's values are fed to the lane's run, or it hands nothing over):
    hand_in: tf.Operation | None = None        # the head's staging of a batch under its ticket (handoff.py) ...
    input_size: tf.Tensor | None = None        # ... the batches waiting for the body ...
    input_discard: tf.Operation | None = None  # ... and their drop (re-initialisation)
    batch_bytes: tf.Tensor | None = None       # bytes of the batch the body copy computes
    ticket: tf.Tensor | None = None            # every run of the lane feeds its batch's ticket here


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
    """Lane `index` as built under `scope` (by build_lane, with its hand-off ops when it has them); KeyError
    when it was not built."""
    names = LaneNames.of(scope, index)
    lane = Lane(graph.get_operation_by_name(names.enqueue), graph.get_operation_by_name(names.move),
                graph.get_tensor_by_name(names.occupancy), graph.get_tensor_by_name(names.size),
                graph.get_operation_by_name(names.discard))
    try:
        lane = dataclasses.replace(
            lane, hand_in=graph.get_operation_by_name(names.hand_in),
            input_size=graph.get_tensor_by_name(names.input_size),
            input_discard=graph.get_operation_by_name(names.input_discard),
            batch_bytes=graph.get_tensor_by_name(names.batch_bytes))
    except KeyError:
        return lane
    try:
        return dataclasses.replace(lane, ticket=graph.get_tensor_by_name(f"{scope}/{lane_scope(index)}/{TICKET}:0"))
    except KeyError:
        return lane


def found_lane_graph(graph: tf.Graph, scope: str, split: PrefetchSplit, lanes: list[Lane],
                     put_inputs: tuple[str, ...]) -> LaneGraph:
    """The LaneGraph of `lanes` found under `scope`, with the scope's own ops (head targets, bytes, occupancy)."""
    targets = graph.get_operation_by_name(f"{scope}/{HEAD_TARGETS}") if split.head_targets else None
    return LaneGraph(split, tuple(lanes), targets, graph.get_tensor_by_name(f"{scope}/{BATCH_BYTES}:0"),
                     graph.get_tensor_by_name(f"{scope}/{PUT_OCCUPANCY}:0"), put_inputs)


def _existing(graph: tf.Graph, scope: str, put: tf.Operation, count: int) -> LaneGraph | None:
    """Lanes built earlier for the same put inputs (a second session on this graph), if any."""
    first = LaneNames.of(scope, 0)
    try:
        marker = graph.get_operation_by_name(first.enqueue)
    except KeyError:
        return None
    inputs = tuple(t.name for t in put.inputs[1:])
    split = split_prefetch_side(put)
    try:  # shared lanes (one body copy): built for the same head values (MapStage(key, indices, *values))
        hand_in = graph.get_operation_by_name(first.hand_in)
        built_for = tuple(t.name for t in hand_in.inputs[2:])
        expected = tuple(t.name for t in split.cut)
    except KeyError:
        built_for, expected = tuple(t.name for t in marker.inputs[1:]), inputs
    if built_for != expected:
        return None
    lanes = []
    for index in range(count):
        try:
            lanes.append(find_lane(graph, scope, index))
        except KeyError:
            break
    if lanes and lanes[0].ticket is not None:  # shared lanes: lane 0's ops are every lane's
        lanes = [lanes[0]] * count
    return found_lane_graph(graph, scope, split, lanes, inputs)


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


def build_shared_lane(put: tf.Operation, split: PrefetchSplit, body: list[tf.Operation], buffer: tf.Tensor,
                      waits: list[tf.Operation]) -> Lane:
    """The ops every lane runs when the head hands its values over (under `lane_0/` of the current scope):
    the head stages a batch's cut under its ticket, the one body copy computes the ticket's batch into an
    output map, and the merger moves the ticket's batch into the stage's `buffer`. Every run feeds the
    ticket, so k lanes run one fetch list each of hand-in, body and move: 3 executors per session instead
    of 3k, and one body copy in the graph instead of k (each build copies the whole graph).

        before:  lane_<i>/{input, hand_in, body/..., queue, enqueue, move} for i < k
        after:   lane_0/{ticket, hand_in -> input map, body/..., enqueue -> output map, move}
    """
    with tf.compat.v1.name_scope(lane_scope(0)) as scope:
        ticket = tf.compat.v1.placeholder(tf.int64, [], name=TICKET)
        hand = build_keyed_hand_off(put, body, split.cut, waits, ticket, scope + "input")
        with tf.compat.v1.name_scope("bytes"):
            total = bytes_of_batch(hand.values)
        batch_bytes = tf.identity(total, name=BATCH_BYTES)
        dtypes = [t.dtype.base_dtype for t in hand.values]
        indices = list(range(len(dtypes)))
        output = scope + "output"
        with tf.control_dependencies(hand.waits):
            enqueue = gen_data_flow_ops.map_stage(ticket, indices, hand.values, dtypes=dtypes, shared_name=output,
                                                  name=LANE_ENQUEUE)
        taken = gen_data_flow_ops.map_unstage(ticket, indices, dtypes=dtypes, shared_name=output, name="dequeue")
        move = gen_data_flow_ops.queue_enqueue_v2(buffer, list(taken), name=LANE_MOVE)
        with tf.control_dependencies([move]):
            occupancy = gen_data_flow_ops.queue_size_v2(buffer, name=LANE_OCCUPANCY)
        size = gen_data_flow_ops.map_size(dtypes=dtypes, shared_name=output, name=LANE_SIZE)
        discard = gen_data_flow_ops.map_clear(dtypes=dtypes, shared_name=output, name=LANE_DISCARD)
    return Lane(enqueue, move, occupancy, size, discard, hand_in=hand.hand_in, input_size=hand.size,
                input_discard=hand.discard, batch_bytes=batch_bytes, ticket=ticket)


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
            body = body_to_copy(put, split.head_ops, split.cut) if split.cut else None  # once for every lane
            refusal = copy_refusal(body) if body else ""
            if refusal:  # the lanes fetch the head's values and feed them: correct, only slower
                logger.warning("stage %s: the lanes feed the head's values instead of copying the body (%s)",
                               stage_name, refusal)
                body = None
            if body is not None:  # one body copy and one executor for every lane
                lanes = [build_shared_lane(put, split, body, buffer, waits)] * count
            else:  # the head's values are fed to each lane's run, or the head hands nothing over
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
        if lane.input_size is not None:
            for _ in range(int(control_run(lane.input_size))):
                control_run(lane.input_discard)


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
