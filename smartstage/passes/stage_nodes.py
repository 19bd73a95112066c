"""The NodeDefs of one stage boundary, built directly in a GraphDef: what `staged()` builds, by hand.

    before:  next_batch = IteratorGetNext(iterator) -> decode -> ...
    after:   stage_node_defs("smart_stage", [next_batch:0], ...) ->
             smart_stage/buffer, put(next_batch:0), take, close, cancel, size, is_closed, ready guard
             (+ stale marks, fresh guard and reset for an initializable iterator)

The auto-stage pass inserts these at an input source; their attributes are those of the ops
`smartstage.runtime.staged()` creates (tests/passes/test_auto_stage.py compares them), so the
prefetch threads, the diff, explain and verify cannot tell an inserted stage from a hand-placed one.

A stage at an initializable iterator also gets the re-initialisation guard:

    <stage>/stale_marks     FIFOQueueV2 (int32, unbounded)   one mark per initializer run
    <stage>/stale_mark      QueueEnqueueV2(stale_marks)       a control input of every MakeIterator
    <stage>/fresh_check     Assert(size(stale_marks) == 0)    a control input of the take
    <stage>/reset           NoOp(^DestroyResourceOp(buffer), ^DestroyResourceOp(stale_marks))

Running an initializer leaves a mark, so a step that would take a batch buffered before the
initializer ran fails at once with a message, instead of training on a stale batch. The runtime
(smartstage.runtime.hooks.reinit) sees the initializer run, stops the stage's prefetch threads first, then
runs `reset` (a destroyed queue is created afresh, empty and open, by its next use) and restarts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import attr_value_pb2, node_def_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from smartstage.config.error_codes import error_codes
from smartstage.config.options import AutoStageOptions
from smartstage.graph.names import input_string, parse_tensor_name
from smartstage.graph.op_types import op_def
from smartstage.protos import StageDef
from smartstage.graph.stages import stale_message

_UNKNOWN_SHAPE = tensor_shape_pb2.TensorShapeProto(unknown_rank=True)


@dataclass(frozen=True)
class StageNodes:
    """What one stage adds: `early` nodes read nothing outside the stage (they may go anywhere before the
    source's consumers and the initializers); `put` reads the carried tensors (after their producers)."""

    name: str
    early: tuple[node_def_pb2.NodeDef, ...]
    put: node_def_pb2.NodeDef
    stage_def: StageDef

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.early) + (self.put.name,)


def _attr(value) -> attr_value_pb2.AttrValue:
    if isinstance(value, attr_value_pb2.AttrValue):
        return value
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    raise TypeError(f"no AttrValue for {value!r}")


def _types(dtypes: list[int]) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=dtypes))


def _shapes(shapes: list) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=shapes))


def _fully_defined(shape) -> bool:
    return shape is not None and not shape.unknown_rank and all(d.size >= 0 for d in shape.dim)


def _node(name: str, op: str, inputs=(), device: str = "", **attrs) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs), device=device)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(_attr(value))
    # Every attribute spelled out, defaults included, as a Python-built graph has them.
    od = op_def(op)
    for a in od.attr if od is not None else ():
        if a.name not in node.attr and a.HasField("default_value"):
            node.attr[a.name].CopyFrom(a.default_value)
    return node


def _const(name: str, dtype: int, device: str, *, int_val: int | None = None, string_val: str | None = None):
    tensor = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto())
    if int_val is not None:
        tensor.int_val.append(int_val)
    if string_val is not None:
        tensor.string_val.append(string_val.encode())
    return _node(name, "Const", (), device, dtype=attr_value_pb2.AttrValue(type=dtype),
                 value=attr_value_pb2.AttrValue(tensor=tensor),
                 _output_shapes=_shapes([tensor_shape_pb2.TensorShapeProto()]))


def _int_queue(name: str, device: str, capacity: int, shared_name: str) -> node_def_pb2.NodeDef:
    return _node(name, "FIFOQueueV2", (), device, component_types=_types([types_pb2.DT_INT32]),
                 shapes=_shapes([tensor_shape_pb2.TensorShapeProto()]), capacity=capacity, container="",
                 shared_name=shared_name)


def stage_node_defs(
    name: str,
    carried: list[str],
    dtypes: list[int],
    shapes: list,
    device: str,
    options: AutoStageOptions,
    *,
    sources: list[str],
    reset_triggers: list[str] = (),
    ready_message: str,
) -> StageNodes:
    """The nodes and the StageDef of a stage named `name` whose put carries the tensors `carried` ("node:port").

    shapes: a TensorShapeProto (or None) per carried tensor; the buffer gets them when all are fully
    defined, as staged() does. Every node is placed on `device`.
    """
    n = f"{name}/"
    resettable = bool(reset_triggers)
    known = [s if s is not None else _UNKNOWN_SHAPE for s in shapes]
    buffer = _node(n + "buffer", "FIFOQueueV2", (), device, component_types=_types(dtypes),
                   shapes=_shapes(known if all(_fully_defined(s) for s in shapes) else []),
                   capacity=int(options.capacity), container="", shared_name=name)
    early = [buffer]
    early += [
        _int_queue(n + "ready_buffer", device, 1, n + "ready_buffer"),
        _const(n + "ready_token", types_pb2.DT_INT32, device, int_val=1),
        _node(n + "ready_put", "QueueEnqueueV2", (n + "ready_buffer", n + "ready_token"), device,
              Tcomponents=_types([types_pb2.DT_INT32]), timeout_ms=-1),
        _node(n + "ready_size", "QueueSizeV2", (n + "ready_buffer",), device),
        _const(n + "ready/y", types_pb2.DT_INT32, device, int_val=0),
        _node(n + "ready", "Greater", (n + "ready_size", n + "ready/y"), device,
              T=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32)),
        _const(n + "ready_message", types_pb2.DT_STRING, device, string_val=ready_message),
        _node(n + "ready_check", "Assert", (n + "ready", n + "ready_message"), device,
              T=_types([types_pb2.DT_STRING]), summarize=3),
    ]
    guards = ["^" + n + "ready_check"]
    if resettable:
        early += [
            _int_queue(n + "stale_marks", device, -1, n + "stale_marks"),
            _node(n + "stale_mark", "QueueEnqueueV2", (n + "stale_marks", n + "ready_token"), device,
                  Tcomponents=_types([types_pb2.DT_INT32]), timeout_ms=-1),
            _node(n + "stale_count", "QueueSizeV2", (n + "stale_marks",), device),
            _const(n + "fresh/y", types_pb2.DT_INT32, device, int_val=0),
            _node(n + "fresh", "Equal", (n + "stale_count", n + "fresh/y"), device,
                  T=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32)),
            _const(n + "fresh_message", types_pb2.DT_STRING, device, string_val=stale_message(name, reset_triggers)),
            _node(n + "fresh_check", "Assert", (n + "fresh", n + "fresh_message"), device,
                  T=_types([types_pb2.DT_STRING]), summarize=3),
        ]
        guards.append("^" + n + "fresh_check")
    early += [
        _node(n + "take", "QueueDequeueV2", [n + "buffer"] + guards, device, component_types=_types(dtypes),
              timeout_ms=-1, _output_shapes=_shapes(known)),
        _node(n + "close", "QueueCloseV2", (n + "buffer",), device, cancel_pending_enqueues=False),
        _node(n + "cancel", "QueueCloseV2", (n + "buffer",), device, cancel_pending_enqueues=True),
        _node(n + "size", "QueueSizeV2", (n + "buffer",), device),
        _node(n + "is_closed", "QueueIsClosedV2", (n + "buffer",), device),
    ]
    if resettable:
        # No device of their own: TensorFlow's placer puts a resource's users with the resource, so they
        # follow the buffer wherever a later pass (GPU placement) moves it. On another device they would
        # look in that device's resources, find nothing (ignore_lookup_error) and empty nothing.
        early += [
            _node(n + "reset_buffer", "DestroyResourceOp", (n + "buffer",), "", ignore_lookup_error=True),
            _node(n + "reset_stale_marks", "DestroyResourceOp", (n + "stale_marks",), "", ignore_lookup_error=True),
            _node(n + "reset", "NoOp", ("^" + n + "reset_buffer", "^" + n + "reset_stale_marks"), device),
        ]
    put_inputs = [input_string(*parse_tensor_name(t)) for t in carried]
    put = _node(n + "put", "QueueEnqueueV2", [n + "buffer"] + put_inputs, device, Tcomponents=_types(dtypes),
                timeout_ms=-1)
    stage_def = StageDef(
        name=name, kind=StageDef.FIFO_QUEUE, buffer_node=n + "buffer", put_node=put.name, take_node=n + "take",
        close_node=n + "close", cancel_node=n + "cancel", size_node=n + "size",
        ready_buffer_node=n + "ready_buffer", ready_put_node=n + "ready_put",
        capacity=int(options.capacity), num_threads=int(options.num_threads),
        num_clients=int(options.num_clients), timeout_millis=int(options.timeout_millis),
        closed_error_codes=error_codes(options.closed_exception_types, "AutoStageOptions.closed_exception_types"),
        ignored_error_codes=error_codes(options.ignored_exception_types, "AutoStageOptions.ignored_exception_types"),
        use_stage_subgraph_thread_pool=options.use_stage_subgraph_thread_pool is True,  # tuned: False, as staged()
        stage_subgraph_thread_pool_id=int(options.stage_subgraph_thread_pool_id),
        stage_subgraph_stream_id=int(options.stage_subgraph_stream_id),
        origin="auto", boundary_tensors=list(carried), source_nodes=list(sources),
        reset_trigger_nodes=list(reset_triggers),
        stale_mark_node=n + "stale_mark" if resettable else "", reset_node=n + "reset" if resettable else "",
    )
    return StageNodes(name=name, early=tuple(early), put=put, stage_def=stage_def)
