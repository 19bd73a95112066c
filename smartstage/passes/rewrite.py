"""rebuild_boundary: the one place that edits NodeDefs for a stage expansion.

    before:  reader -> put(reader) ~~ take -> hash -> lookup(w)
    after:   reader -> hash -> put(hash) ~~ take -> lookup(w)      (hash now reads reader directly)

Given a StagePartition computed on the old graph, it edits a copy of the GraphDef in place:
- moved nodes read the put's inputs instead of the take's outputs (a control edge on the take becomes
  control edges on the put's producers);
- main-side consumers read the new take outputs; control edges from moved nodes to the main side are
  re-routed: the source becomes a control input of the put, the destination waits on the take;
- the put carries exactly the boundary tensors; the take, the buffer and every other op of the same
  buffer get the new dtypes (and shapes, where every shape is known).
Every node keeps its name.
"""

from __future__ import annotations

from typing import Callable, Collection

from tensorflow.core.framework import attr_value_pb2, graph_pb2, tensor_shape_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import CONTROL_PORT, input_string, parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import dtype_name
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
        dtypes.append(dtype - 100 if dtype > 100 else dtype)  # a ref crosses as a value
    return dtypes


def _set_inputs(node, data: list[str], control: list[str]) -> None:
    del node.input[:]
    node.input.extend(data)
    node.input.extend(dict.fromkeys(control))


def _split(node) -> tuple[list[str], list[str]]:
    data, control = [], []
    for s in node.input:
        (control if s.startswith("^") else data).append(s)
    return data, control


def _type_list(dtypes: list[int]) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=dtypes))


def rebuild_boundary(
    graph_def: graph_pb2.GraphDef,
    view: GraphView,
    partition: StagePartition,
    shape_of: ShapeLookup,
    edited_before: Collection[str] = (),
) -> tuple[list[int], set[str]]:
    """Applies `partition` to `graph_def` (a copy of view.graph_def, nodes in the same positions), after
    the rewrites of other stages that edited `edited_before`.

    Returns the boundary dtypes and the names of the nodes it edited. The view describes the graph
    before any edit.
    """
    stage = partition.stage
    take = stage.take
    moved = set(partition.moved)
    own = set(stage.ops)
    dtypes = boundary_dtypes(view, partition)
    put_inputs = stage.put_data_inputs(view)
    slot = {name: j for j, name in enumerate(partition.boundary_after)}
    producers = list(dict.fromkeys([t.node for t in put_inputs] + view.control_inputs(stage.put)))

    edited: set[str] = set()

    def node(name: str):
        edited.add(name)
        return graph_def.node[view.position(name)]

    def inputs(name: str, n) -> list:
        """(input string, TensorName) of `n`: the view's parse while the node is as the view saw it."""
        if name in edited_before:  # another stage's rewrite edited it: parse what it has now
            return [(s, parse_tensor_name(s)) for s in n.input]
        return list(zip(n.input, view.inputs(name)))

    # 1. Moved nodes read what the put used to carry (only those that read the take change).
    for name in partition.take_readers:
        n = node(name)
        data, control = [], []
        for s, t in inputs(name, n):
            if t.node != take:
                (control if t.port == CONTROL_PORT else data).append(s)
            elif t.port == CONTROL_PORT:
                control.extend("^" + p for p in producers)
            else:
                src = put_inputs[t.port]
                data.append(input_string(src.node, src.port))
        _set_inputs(n, data, control)

    # 2. Main-side consumers read the new take outputs; control edges from moved nodes wait on the take.
    for name in partition.main_readers:
        n = node(name)
        data, control = [], []
        reads_take = False
        for s, t in inputs(name, n):
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
        _set_inputs(n, data, control)

    # 3. The put carries exactly the boundary tensors; re-routed control sources run before it.
    put = node(stage.put)
    data, control = _split(put)
    handle = data[:1] if stage.kind == FIFO else []
    boundary = [input_string(*parse_tensor_name(t)) for t in partition.boundary_after]
    control += ["^" + src for src, _ in partition.control_reroutes]
    _set_inputs(put, handle + boundary, control)

    # 4. Every op of the buffer learns the new dtypes (and shapes when all are known).
    shapes = [shape_of(t) for t in partition.boundary_after]
    known = all(s is not None and not s.unknown_rank and all(d.size >= 0 for d in s.dim) for s in shapes)
    type_attr = {"QueueEnqueueV2": "Tcomponents", "QueueEnqueue": "Tcomponents"}
    for name in stage.ops:
        n = node(name)
        key = type_attr.get(n.op) or next((k for k in ("component_types", "dtypes") if k in n.attr), None)
        if key:
            n.attr[key].CopyFrom(_type_list(dtypes))
        if "shapes" in n.attr and n.op in ("FIFOQueueV2", "FIFOQueue"):
            n.attr["shapes"].CopyFrom(attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(shape=shapes if known else [])))
    take_node = node(take)
    if "_output_shapes" in take_node.attr:
        unknown = tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
        take_node.attr["_output_shapes"].CopyFrom(attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(shape=[s if s is not None else unknown for s in shapes])))
    return dtypes, edited


def describe_dtypes(dtypes: list[int]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


