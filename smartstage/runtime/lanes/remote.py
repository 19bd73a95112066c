"""Lanes on input tasks: the runtime side of scale-out (passes/input_tasks.py places, this runs).

    before:  lane i runs the body on the trainer               (runtime/lanes/lanes.py)
    after:   lane i runs the copy of the body on task i mod N  (central: the trainer's head feeds it)
             task i runs its own shard of the input, batches interleaved round-robin  (sharded)

The optimizer leaves a marker NoOp `<stage>/input_tasks` whose attributes hold the plan: the tasks,
the mode, the tensors the trainer hands to the tasks (the cut), the run timeout and lanes per task.
Task 0 runs the original nodes (placed there by the pass); task i > 0 runs the copies under
`<stage>/input_task_<i>/`. Every lane's queue stays on the trainer next to the stage buffer, so each
boundary tensor travels once over TensorFlow's own transport (gRPC), inside the lane's run.

A lane run that fails because its task is gone (UnavailableError, AbortedError) or silent
(DeadlineExceededError after `timeout_millis`) becomes an InputTaskError naming the task.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.ops import gen_data_flow_ops

from smartstage.errors import InputTaskError, StageRuntimeError
from smartstage.graph.stage_names import (ATTR_CUT, ATTR_MODE, ATTR_TASKS, ATTR_THREADS_PER_TASK, ATTR_TIMEOUT,
                                          BATCH_BYTES, HEAD_TARGETS, PUT_OCCUPANCY, REMOTE_LANES_SCOPE, LaneNames,
                                          input_task_scope, input_tasks_marker)
from smartstage.runtime.lanes.lanes import (LaneGraph, build_lane, bytes_of_batch, find_lane, found_lane_graph,
                                            prepare_lanes)
from smartstage.runtime.lanes.split import PrefetchSplit

logger = logging.getLogger(__name__)

_TASK_IN_MESSAGE = re.compile(r"/job:[\w-]+/replica:\d+/task:\d+")


@dataclass(frozen=True)
class RemotePlan:
    """The placement the optimizer recorded for one stage."""

    stage: str
    mode: str                    # "central" or "sharded"
    tasks: tuple[str, ...]       # device of each input task's CPU, task i at index i
    cut: tuple[str, ...]         # central: tensors the trainer's head hands to the body
    timeout_millis: int
    num_threads_per_task: int

    @property
    def lane_count(self) -> int:
        return len(self.tasks) * self.num_threads_per_task

    def task_of_lane(self, lane: int) -> int:
        return lane % len(self.tasks)

    def run_options(self, base: config_pb2.RunOptions | None = None) -> config_pb2.RunOptions:
        """`base` with this plan's timeout: a lane run never waits longer on a silent task."""
        options = config_pb2.RunOptions()
        if base is not None:
            options.CopyFrom(base)
        options.timeout_in_ms = self.timeout_millis
        return options


def remote_plan(graph: tf.Graph, stage_name: str) -> RemotePlan | None:
    """The plan the optimizer left for `stage_name` in `graph`, or None (the stage runs locally)."""
    try:
        marker = graph.get_operation_by_name(input_tasks_marker(stage_name))
    except KeyError:
        return None
    attrs = marker.node_def.attr
    return RemotePlan(stage_name, attrs[ATTR_MODE].s.decode(),
                      tuple(s.decode() for s in attrs[ATTR_TASKS].list.s),
                      tuple(s.decode() for s in attrs[ATTR_CUT].list.s),
                      int(attrs[ATTR_TIMEOUT].i) or 60000,
                      max(1, int(attrs[ATTR_THREADS_PER_TASK].i)))


def _on_task(graph: tf.Graph, plan: RemotePlan, task: int, tensor: tf.Tensor) -> tf.Tensor:
    """Task `task`'s copy of `tensor` (the tensor itself on task 0, or when the pass did not copy it)."""
    if task == 0:
        return tensor
    try:
        op = graph.get_operation_by_name(input_task_scope(plan.stage, task) + tensor.op.name)
    except KeyError:
        return tensor
    return op.outputs[tensor.value_index]


def _op_on_task(graph: tf.Graph, plan: RemotePlan, task: int, op: tf.Operation) -> tf.Operation:
    if task == 0:
        return op
    try:
        return graph.get_operation_by_name(input_task_scope(plan.stage, task) + op.name)
    except KeyError:
        return op


def remote_lane_graph(graph: tf.Graph, plan: RemotePlan, put: tf.Operation, buffer: tf.Tensor) -> LaneGraph:
    """The lanes of a placed stage: lane i's enqueue reads task (i mod N)'s body; built once per graph.

        before:  stage/put(buffer, a, b)                 a, b on /job:input/task:0
        after:   stage/remote_lanes/lane_<i>/{queue, enqueue(a', b'), move, occupancy, size, discard}
                 with a', b' the copies on /job:input/task:(i mod N)
    """
    scope = f"{plan.stage}/{REMOTE_LANES_SCOPE}"
    cut = tuple(graph.get_tensor_by_name(name) for name in plan.cut)
    head_targets_ops = tuple(c for c in put.control_inputs if _is_head(c, plan))
    split = PrefetchSplit(frozenset(), cut, head_targets_ops)
    components = list(put.inputs[1:])
    try:
        graph.get_operation_by_name(LaneNames.of(scope, 0).enqueue)
        return _existing(graph, scope, plan, split, components)
    except KeyError:
        pass
    if graph.finalized:
        raise StageRuntimeError(
            f"stage '{plan.stage}': the graph is finalized and has no lanes for its input tasks; start the "
            "prefetch threads (or create the session with smartstage.make_prefetch_hook()) before finalizing")
    lanes = []
    with graph.as_default(), tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(scope + "/"), \
            tf.device(put.device):
        for index in range(plan.lane_count):
            task = plan.task_of_lane(index)
            values = [_on_task(graph, plan, task, t) for t in components]
            waits = [_op_on_task(graph, plan, task, c) for c in put.control_inputs if c not in head_targets_ops]
            lanes.append(build_lane(index, buffer, values, waits))
        targets = tf.group(*head_targets_ops, name=HEAD_TARGETS) if head_targets_ops else None
        batch_bytes = tf.identity(bytes_of_batch(components), name=BATCH_BYTES)
        with tf.control_dependencies([put]):
            put_occupancy = gen_data_flow_ops.queue_size_v2(buffer, name=PUT_OCCUPANCY)
    logger.info("stage %s: %d lanes on input tasks %s (%s mode)", plan.stage, len(lanes), list(plan.tasks), plan.mode)
    return LaneGraph(split, tuple(lanes), targets, batch_bytes, put_occupancy, tuple(t.name for t in components))


def prepare_all_lanes(graph: tf.Graph, stages) -> None:
    """The lanes of every stage, built while the graph can still grow: on the input tasks for a stage placed
    there (its marker), on the trainer otherwise (lanes.prepare_lanes). The prefetch hook's begin() and
    ss.Session call it, before MonitoredTrainingSession finalizes the graph or a run races the build.

        before:  stage/input_tasks (the plan), graph about to be finalized
        after:   stage/remote_lanes/lane_<i>/...  (StageThreads finds them: remote_lane_graph reuses them)
    """
    local = []
    for stage_def in stages:
        plan = None if stage_def.unordered else remote_plan(graph, stage_def.name)
        if plan is None:
            local.append(stage_def)
        elif not graph.finalized:
            put = graph.get_operation_by_name(stage_def.put_node)
            remote_lane_graph(graph, plan, put, put.inputs[0])
    prepare_lanes(graph, local)


def _is_head(op: tf.Operation, plan: RemotePlan) -> bool:
    """A control input of the put that the trainer runs: the pass placed every body node on task 0."""
    return plan.mode == "central" and op.device != plan.tasks[0]


def _existing(graph, scope, plan, split, components) -> LaneGraph:
    lanes = [find_lane(graph, scope, index) for index in range(plan.lane_count)]
    return found_lane_graph(graph, scope, split, lanes, tuple(t.name for t in components))


def _cause_line(error: BaseException) -> str:
    """The line of a gRPC error that says what happened ("Socket closed", "Connection refused", ...)."""
    lines = [line.strip() for line in str(error).splitlines()]
    useful = [line for line in lines if line and not set(line) <= {"="} and "Graph execution error" not in line
              and not line.startswith(("From /job", "UNAVAILABLE: From", "Additional GRPC"))]
    return (useful[0] if useful else type(error).__name__)[:160]


_TASK_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError)


def named_task_error(error: BaseException, plan: RemotePlan, lane: int | None) -> BaseException:
    """`error` as an InputTaskError naming the input task, when a task failing caused it; else `error`.

        before:  UnavailableError: ... Socket closed
        after:   InputTaskError: stage 'stage': input task /job:input/replica:0/task:1 is unreachable ...
    """
    if not isinstance(error, _TASK_FAILURES):
        return error
    named = _TASK_IN_MESSAGE.findall(str(error))
    tasks = [t for t in named if any(t in task for task in plan.tasks)]
    task = tasks[0] if tasks else (plan.tasks[plan.task_of_lane(lane)].rsplit("/device", 1)[0]
                                   if lane is not None else "one of " + ", ".join(plan.tasks))
    if isinstance(error, tf.errors.DeadlineExceededError):
        what = f"did not answer within {plan.timeout_millis} ms (input_timeout_millis)"
    else:
        what = f"is unreachable or died ({type(error).__name__}: {_cause_line(error)})"
    message = (f"stage '{plan.stage}': input task {task} {what}; the batches before it were trained. Restart the "
               "task and the job (variables and checkpoints live on the trainer and parameter servers, so it "
               "resumes from the last checkpoint), or run without input_job")
    named_error = InputTaskError(message, task, error)
    named_error.__cause__ = error
    return named_error


__all__ = ["InputTaskError", "RemotePlan", "named_task_error", "prepare_all_lanes", "remote_lane_graph", "remote_plan"]
