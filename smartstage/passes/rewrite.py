"""rebuild_boundary: the edits of one stage expansion, as an edit log (smartstage.graph.edits).

    before:  reader -> put(reader) ~~ take -> hash -> lookup(w)
    after:   reader -> hash -> put(hash) ~~ take -> lookup(w)      (hash now reads reader directly)

Given a StagePartition computed on the old graph, it records in the log:
- moved nodes read the put's inputs instead of the take's outputs (a control edge on the take becomes
  control edges on the put's producers);
- main-side consumers read the new take outputs; control edges from moved nodes to the main side are
  re-routed: the source becomes a control input of the put, the destination waits on the take;
- the put carries exactly the boundary tensors; the take, the buffer and every other op of the same
  buffer get the new dtypes (and shapes, where every shape is known).
Every node keeps its name. apply_to_graph_def writes the log into a GraphDef; a session's live graph
gets the same log (smartstage.session.live_edits), which builds new buffer ops where the dtypes change.
"""

from __future__ import annotations

from typing import Callable

from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2

from smartstage.errors import GraphError
from smartstage.graph.edits import EditLog, dedupe_controls
from smartstage.graph.names import CONTROL_PORT, input_string, parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import REF_DTYPE_OFFSET, dtype_name, is_ref_dtype
from smartstage.graph.stages import FIFO
from smartstage.passes.partition import StagePartition

ShapeLookup = Callable[[str], "tensor_shape_pb2.TensorShapeProto | None"]


def boundary_dtypes(view: GraphView, partition: StagePartition) -> list[int]:
    """The dtype of every boundary tensor; GraphError names a tensor whose dtype cannot be known."""
    dtypes = []
    for name in partition.boundary_after:
        t = parse_tensor_name(name)
        dtype = view.dtype_of(t)
        if dtype is None:
            raise GraphError(
                f"stage {partition.stage.name!r}: tensor {name!r} must cross the boundary, but its dtype cannot be "
                f"known (node {t.node!r} has op type {view.op(t.node)!r}, unknown to this TensorFlow and without a "
                "'dtype'/'T'/'dtypes' attribute); mark it as a target (smartstage.mark_target_node) so it stays on "
                "the main side, or load the op library that defines it"
            )
        dtypes.append(dtype - REF_DTYPE_OFFSET if is_ref_dtype(dtype) else dtype)  # a ref crosses as a value
    return dtypes


def _split(inputs) -> tuple[list[str], list[str]]:
    data, control = [], []
    for s in inputs:
        (control if s.startswith("^") else data).append(s)
    return data, control


def _type_list(dtypes: list[int]) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=dtypes))


def rebuild_boundary(
    log: EditLog,
    view: GraphView,
    partition: StagePartition,
    shape_of: ShapeLookup,
) -> tuple[list[int], set[str]]:
    """Records in `log` the edits that apply `partition` (computed on `view`, the graph before any edit),
    after the edits already in the log (other stages' rewrites).

    Returns the boundary dtypes and the names of the nodes it edited.
    """
    stage = partition.stage
    take = stage.take
    moved = set(partition.moved)
    dtypes = boundary_dtypes(view, partition)
    put_inputs = stage.put_data_inputs(view)
    slot = {name: j for j, name in enumerate(partition.boundary_after)}
    producers = list(dict.fromkeys([t.node for t in put_inputs] + view.control_inputs(stage.put)))

    edited: set[str] = set()

    def inputs(name: str) -> list:
        """(input string, TensorName) of `name` as planned so far: the view's parse while the log has not
        changed it, else the parse of what the log set."""
        edited.add(name)
        if log.inputs_edited(name):  # another stage's rewrite edited it
            return [(s, parse_tensor_name(s)) for s in log.inputs_of(name)]
        return list(zip(view.raw_inputs(name), view.inputs(name)))

    def set_inputs(name: str, data: list[str], control: list[str]) -> None:
        log.set_inputs(name, dedupe_controls(data + control))

    # 1. Moved nodes read what the put used to carry (only those that read the take change).
    for name in partition.take_readers:
        data, control = [], []
        for s, t in inputs(name):
            if t.node != take:
                (control if t.port == CONTROL_PORT else data).append(s)
            elif t.port == CONTROL_PORT:
                control.extend("^" + p for p in producers)
            else:
                src = put_inputs[t.port]
                data.append(input_string(src.node, src.port))
        set_inputs(name, data, control)

    # 2. Main-side consumers read the new take outputs; control edges from moved nodes wait on the take.
    for name in partition.main_readers:
        data, control = [], []
        reads_take = False
        for s, t in inputs(name):
            if t.port == CONTROL_PORT:
                control.append("^" + take if t.node in moved else s)
            elif t.node == take:
                data.append(input_string(take, slot[str(put_inputs[t.port])]))
                reads_take = True
            elif t.node in moved:
                data.append(input_string(take, slot[str(t)]))
                reads_take = True
            else:
                data.append(s)
        if reads_take:  # a data input from the take orders the node after it already
            control = [c for c in control if c != "^" + take]
        set_inputs(name, data, control)

    # 3. The put carries exactly the boundary tensors; re-routed control sources run before it.
    data, control = _split(s for s, _ in inputs(stage.put))
    handle = data[:1] if stage.kind == FIFO else []
    boundary = [input_string(*parse_tensor_name(t)) for t in partition.boundary_after]
    control += ["^" + src for src, _ in partition.control_reroutes]
    set_inputs(stage.put, handle + boundary, control)

    # 4. Every op of the buffer learns the new dtypes (and shapes when all are known).
    shapes = [shape_of(t) for t in partition.boundary_after]
    known = all(s is not None and not s.unknown_rank and all(d.size >= 0 for d in s.dim) for s in shapes)
    type_attr = {"QueueEnqueueV2": "Tcomponents", "QueueEnqueue": "Tcomponents"}
    for name in stage.ops:
        edited.add(name)
        n = view.node(name)
        key = type_attr.get(n.op) or next((k for k in ("component_types", "dtypes") if k in n.attr), None)
        if key:
            log.set_attr(name, key, _type_list(dtypes))
        if "shapes" in n.attr and n.op in ("FIFOQueueV2", "FIFOQueue"):
            log.set_attr(name, "shapes", attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(shape=shapes if known else [])))
    edited.add(take)
    if "_output_shapes" in view.node(take).attr:
        unknown = tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
        log.set_attr(take, "_output_shapes", attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(shape=[s if s is not None else unknown for s in shapes])))
    return dtypes, edited


def describe_dtypes(dtypes: list[int]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


