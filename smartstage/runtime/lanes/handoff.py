"""The head hands a batch to the lanes inside TensorFlow: no round trip of the values through Python.

    before:  head run fetches GetNext:0 (512 strings) to Python; lane i's body run feeds them back in
    after:   head run stages GetNext:0 under ticket n; the body copy, run for ticket n, takes it

The lanes need a copy of the body for that (a fed tensor can be replaced by a value, not by another
tensor): the ops of the prefetch side outside the head that depend on the head's values are imported
once under `lane_0/body/` (build_keyed_hand_off), reading the staged values where the original reads the head, and the
original tensors everywhere else (a table's handle, a constant, a stateless op that does not depend on
the batch). The copy computes exactly what the original computes from the same values, and a batch
runs it once, so no op runs more or fewer times per batch than without lanes. Stateful ops are all in
the head (runtime/lanes.split_prefetch_side): nothing stateful is copied.

The copy costs graph size (the body's nodes once more), built when the prefetch threads start.

Whether the body can be copied is decided before any lane op exists (copy_refusal: analysis only). A
body that cannot be copied (an op reading a tensor inside a control-flow-v1 `tf.while_loop` that does
not depend on the batch, so the copy would cross into the loop's frame; a NodeDef that does not import)
leaves the stage on the fetch-and-feed path: correct, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.python.ops import control_flow_util, gen_data_flow_ops
from tensorflow.python.ops import handle_data_util

from smartstage.graph.stage_names import LANE_HAND_IN, LANE_INPUT_DISCARD, LANE_INPUT_SIZE


@dataclass(frozen=True)
class HandOff:
    """The lanes' input: the head's staging of the cut, and the body copy's values of the put's inputs."""

    hand_in: tf.Operation             # head run: cut -> the input map, under the batch's ticket
    values: list[tf.Tensor]           # the put's inputs as the lane computes them
    waits: list[tf.Operation]         # the put's control inputs, copied where the body has them
    size: tf.Tensor                   # batches waiting in the input map
    discard: tf.Operation             # drops what waits (re-initialisation)


def body_to_copy(put: tf.Operation, head_ops: frozenset[str], cut: tuple[tf.Tensor, ...]) -> list[tf.Operation]:
    """The ops between the head's values and the put: what each lane copies (topological order).

        before:  GetNext -> decode -> hash -> put,  Const -> hash
        after:   [decode, hash]      (GetNext is the head; the Const does not depend on the batch)
    """
    cut_ops = {t.op for t in cut}
    side: set[tf.Operation] = set()
    todo = [put]
    while todo:  # the prefetch side below the head
        op = todo.pop()
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            if source not in side and source.name not in head_ops:
                side.add(source)
                todo.append(source)
    depends: set[tf.Operation] = set()
    grew = True
    while grew:  # fixpoint: an op depends on the batch when any of its inputs does
        grew = False
        for op in sorted(side - depends, key=lambda o: o._id):  # creation order: mostly one pass
            if any(t.op in cut_ops or t.op in depends for t in op.inputs) or any(
                    c in depends for c in op.control_inputs):
                depends.add(op)
                grew = True
    return sorted(depends, key=lambda o: o._id)


def _body_def(ops: list[tf.Operation]) -> graph_pb2.GraphDef:
    graph_def = graph_pb2.GraphDef()
    for op in ops:
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        node.attr.pop("_class", None)  # colocation names the originals' ops; the device is kept as is
    return graph_def


def _copy(ops: list[tf.Operation], input_map: dict) -> dict[tf.Operation, tf.Operation]:
    """Imports `ops` once under `body/` of the current name scope; original op -> copy."""
    copies = tf.graph_util.import_graph_def(_body_def(ops), input_map=input_map,
                                            return_elements=[op.name for op in ops], name="body")
    return dict(zip(ops, copies))


def _outside_inputs(ops: list[tf.Operation]) -> tuple[list[tf.Tensor], list[tf.Operation]]:
    """The tensors and the control inputs that `ops` read from outside themselves, each once, in order
    (the keys of a copy's input_map: import_graph_def refuses one that no copied op reads)."""
    copied = set(ops)
    tensors: dict[str, tf.Tensor] = {}
    controls: dict[str, tf.Operation] = {}
    for op in ops:
        for tensor in op.inputs:
            if tensor.op not in copied:
                tensors.setdefault(tensor.name, tensor)
        for control in op.control_inputs:
            if control not in copied:
                controls.setdefault(control.name, control)
    return list(tensors.values()), list(controls.values())


def _loop_crossing(ops: list[tf.Operation]) -> str:
    """The first copied op that would read a tensor inside a control-flow-v1 while loop it is not part of.

    A copy is imported outside every control-flow context, and TensorFlow refuses an input from inside a
    while loop there (control_flow_util.CheckInputFromValidContext; Enter and Switch are the exceptions it
    makes): the loop's counter, which does not depend on the batch, stays the original's.
    """
    copied = set(ops)
    for op in ops:
        if control_flow_util.IsLoopEnter(op) or control_flow_util.IsSwitch(op):
            continue
        for tensor in op.inputs:
            context = None if tensor.op in copied else control_flow_util.GetOutputContext(tensor.op)
            if context is not None and control_flow_util.GetContainingWhileContext(context) is not None:
                return (f"{op.name}: reads '{tensor.name}' inside a control-flow-v1 while loop that the copy "
                        "cannot enter")
    return ""


def _functions(graph: tf.Graph, nodes) -> function_pb2.FunctionDefLibrary:
    """The graph's functions that `nodes` call, directly or through other functions (op types, func attrs)."""
    library = function_pb2.FunctionDefLibrary()
    seen: set[str] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        names = [node.op] + [a.func.name for a in node.attr.values() if a.HasField("func")]
        names += [f.name for a in node.attr.values() if a.HasField("list") for f in a.list.func]
        for name in names:
            if name and name not in seen and graph._is_function(name):  # noqa: SLF001
                seen.add(name)
                definition = graph._get_function(name).definition  # noqa: SLF001
                library.function.add().CopyFrom(definition)
                todo.extend(definition.node_def)
    return library


def _failed_op(error: Exception, ops: list[tf.Operation]) -> str:
    """`<op>: <cause>` with the copied op the message names, when it names one."""
    cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    named = [op.name for op in ops if f"'{op.name}'" in cause or f"/{op.name}'" in cause]
    return f"{max(named, key=len)}: {cause}" if named else cause


def _import_refusal(ops: list[tf.Operation]) -> str:
    """Imports the body's NodeDefs into a scratch graph whose outside inputs are placeholders of the same
    dtypes and shapes (NoOps for control inputs): what the lane copy's import would refuse, found without
    adding an op to the user's graph."""
    tensors, controls = _outside_inputs(ops)
    graph_def = _body_def(ops)
    graph_def.library.CopyFrom(_functions(ops[0].graph, graph_def.node))
    with tf.Graph().as_default():
        input_map: dict = {}
        for tensor in tensors:
            outside = tf.compat.v1.placeholder(tensor.dtype.base_dtype, tensor.shape)
            handle_data_util.copy_handle_data(tensor, outside)  # a table's or variable's handle data
            input_map[tensor.name] = outside
        input_map.update({"^" + control.name: tf.no_op() for control in controls})
        try:
            tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="body")
        except Exception as error:  # noqa: BLE001  any refusal leaves the stage on the feed path, never wrong
            return _failed_op(error, ops)
    return ""


def copy_refusal(ops: list[tf.Operation]) -> str:
    """Why the lanes cannot have a copy of `ops` ("": they can). Analysis only: nothing is built.

        before:  body [while/Merge_1, ...] reading while/Enter (the loop counter, not copied)
        after:   "while/Merge_1: reads 'while/Enter:0' inside a control-flow-v1 while loop ..."
    """
    if not ops:
        return ""
    return _loop_crossing(ops) or _import_refusal(ops)


def _hand_off(put: tf.Operation, ops: list[tf.Operation], cut: tuple[tf.Tensor, ...], waits: list[tf.Operation],
              taken: list[tf.Tensor], queue_ops: tuple) -> HandOff:
    """The copy of `ops` reading `taken` where the originals read `cut`, and the HandOff around it."""
    for tensor, value in zip(cut, taken):
        value.set_shape(tensor.shape)
    cut_map = dict(zip((t.name for t in cut), taken))
    tensors, controls = _outside_inputs(ops)
    input_map: dict = {t.name: cut_map.get(t.name, t) for t in tensors}
    input_map.update({"^" + control.name: control for control in controls})
    copies = _copy(ops, input_map) if ops else {}
    values = [copies[t.op].outputs[t.value_index] if t.op in copies else cut_map.get(t.name, t)
              for t in put.inputs[1:]]
    hand_in, size, discard = queue_ops
    return HandOff(hand_in, values, [copies.get(w, w) for w in waits], size, discard)


def build_keyed_hand_off(put: tf.Operation, ops: list[tf.Operation], cut: tuple[tf.Tensor, ...],
                         waits: list[tf.Operation], ticket: tf.Tensor, shared_name: str) -> HandOff:
    """One hand-off for every lane: the head stages the cut under its ticket in one map, and the one copy
    of `ops` (under `body/`) takes the values of the ticket it is run with (runtime/lanes/lanes.py, shared
    lanes): one copy and one executor of the body whatever the lane count.

        before:  lane_i/hand_in: cut -> lane i's input queue;   lane_i/body/...: k copies
        after:   hand_in(ticket): cut -> map[ticket];            body/...(ticket): one copy
    """
    dtypes = [t.dtype.base_dtype for t in cut]
    indices = list(range(len(cut)))
    hand_in = gen_data_flow_ops.map_stage(ticket, indices, list(cut), dtypes=dtypes, shared_name=shared_name,
                                          name=LANE_HAND_IN)
    taken = gen_data_flow_ops.map_unstage(ticket, indices, dtypes=dtypes, shared_name=shared_name,
                                          name="take_input")
    size = gen_data_flow_ops.map_size(dtypes=dtypes, shared_name=shared_name, name=LANE_INPUT_SIZE)
    discard = gen_data_flow_ops.map_clear(dtypes=dtypes, shared_name=shared_name, name=LANE_INPUT_DISCARD)
    return _hand_off(put, ops, cut, waits, list(taken), (hand_in, size, discard))


__all__ = ["HandOff", "body_to_copy", "build_keyed_hand_off", "copy_refusal"]
