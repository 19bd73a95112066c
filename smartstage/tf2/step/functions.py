"""functions: the two TF2 functions built from the two sides of a split step.

    prefetch side -> a map function:   dataset.map(prefetch_fn, num_parallel_calls=AUTOTUNE, deterministic=True)
    main side     -> a tf.function:    main_fn(*element) runs the rest of the step on the SAME variables

Each element carries the boundary tensors; those of one dtype with a static shape travel as one packed
rank-1 tensor when that costs less than carrying them apart (Packing, with the cut-cost constants).

Each side's GraphDef is imported into the function being traced (`tf.graph_util.import_graph_def` with an
`input_map`): the input placeholders read the map function's arguments or the boundary tensors, and every
captured placeholder reads the user's own resource handle, captured again here. So the main side updates
the user's variables and optimizer slots, and a lookup on the prefetch side reads the user's table.
Imported once per trace; each call runs the imported graph like any traced step.

Measured against the stock pruner (`python -m benchmarks.tf2_build_ways`, docs/tf2.md "How the two functions
are built"): `tf.compat.v1.wrap_function(import of the step).prune(boundary, outputs)` gives the same losses
and about as many ops, but ran the main side 11x slower (104 vs 1144 steps/s, 5 interleaved rounds) and built slower;
`function_def_to_graph` gives a FuncGraph that only private constructors make callable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def, drop_colocation
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.rewrites import Sides
from smartstage.graph.view import GraphView
from smartstage.tf2.step.trace import TracedStep

logger = logging.getLogger(__name__)

IMPORT_SCOPE = "step"


def _capture_map(graph_def: graph_pb2.GraphDef, traced: TracedStep,
                 handles: dict[int, Any] | None = None) -> dict[str, Any]:
    """{placeholder tensor: the user's captured tensor} for the captures this side still reads; `handles`
    ({id(captured tensor): stand-in}) replaces some, so the function runs on copies (smartstage.tf2.step.trial)."""
    names = {node.name for node in graph_def.node}
    handles = handles or {}
    return {f"{c.placeholder}:0": handles.get(id(c.external), c.external) for c in traced.captures
            if c.placeholder in names}


def without_mapped(graph_def: graph_pb2.GraphDef, mapped) -> graph_pb2.GraphDef:
    """`graph_def` without the placeholders an import maps (their readers read the mapped tensors) and without
    the placeholders nothing reads (a table's handle once its lookups moved): a placeholder left in a function
    is an op XLA cannot compile (jit_compile=True).

        before:  batch(Placeholder) -> hash; table(Placeholder), mapped = {"batch:0"}
        after:   hash (reading batch:0 through the import's input_map)
    """
    view = GraphView(graph_def)
    log = EditLog(view)
    removed = set()
    mapped_nodes = {parse_tensor_name(t).node for t in mapped}
    for name in view.nodes_of_type(("Placeholder",)):
        if name in mapped_nodes or not view.consumers(name):
            log.remove_node(name)
            removed.add(name)
    drop_colocation(log, view.names(), removed)  # colocation with a removed placeholder goes with it
    return apply_to_graph_def(graph_def, log.edits, view)


def _import(graph_def: graph_pb2.GraphDef, input_map: dict[str, tf.Tensor], captures: dict[str, Any],
            returns: list[str]) -> list:
    graph = tf.compat.v1.get_default_graph()
    read = {str(parse_tensor_name(s)) for node in graph_def.node for s in node.input if not s.startswith("^")}
    full_map = {name: value for name, value in input_map.items() if name in read}
    for name, external in captures.items():
        if name in read:
            full_map[name] = graph.capture(external)  # the user's handle, captured by the function being traced
    return tf.graph_util.import_graph_def(without_mapped(graph_def, full_map), input_map=full_map,
                                          return_elements=returns, name=IMPORT_SCOPE)


def _run_imported(graph_def: graph_pb2.GraphDef, input_map: dict[str, Any], captures: dict[str, Any],
                  outputs: list[str], effects: list[str], structure) -> Any:
    """A step's GraphDef imported into the function being traced: its outputs, packed as the step returned
    them, after its effects (`effects`: the ops it runs for their updates), as in the traced step."""
    found = _import(graph_def, input_map, captures, outputs + effects)
    values = found[:len(outputs)]
    if effects:
        with tf.control_dependencies(found[len(outputs):]):
            values = [tf.identity(v) for v in values]
    return None if structure is None else tf.nest.pack_sequence_as(structure, values, expand_composites=True)


def mapped_dataset(dataset: tf.data.Dataset, prefetch_fn: Callable, *, deterministic: bool,
                   num_threads: int = tf.data.AUTOTUNE, tf_data_service: str | None = None) -> tf.data.Dataset:
    """`dataset` through the prefetch side: a parallel map in input order (deterministic=True), on a tf.data
    service dispatcher when one is named (smartstage.tf2.step.service), then prefetched.

        before:  for batch in dataset: step(batch)
        after:   for element in mapped_dataset(dataset, prefetch_fn, deterministic=True): main_side(*element)
    """
    mapped = dataset.map(prefetch_fn, num_parallel_calls=num_threads, deterministic=deterministic)
    if tf_data_service is not None:
        from smartstage.tf2.step.service import distribute_on_service

        mapped = distribute_on_service(mapped, tf_data_service)
    return mapped.prefetch(tf.data.AUTOTUNE)


@dataclass(frozen=True)
class Packing:
    """How the boundary crosses in each dataset element: some tensors as they are, then one rank-1 tensor per
    packed group (same dtype, static shape), which the main side splits and reshapes back.

        before:  element = (ids:0 int64[256], Size:0 int32[], concat:0 int32[2], label:0 float32[256])
        after:   element = (ids:0, label:0, int32[3])      # Size and concat packed: one tensor fewer
    """

    plain: tuple[int, ...]  # boundary indices carried as they are
    groups: tuple[tuple[int, ...], ...] = ()  # boundary indices packed together, in boundary order
    shapes: tuple = ()  # per boundary index: its static shape (a list), for the packed ones

    @property
    def width(self) -> int:
        """Tensors per dataset element."""
        return len(self.plain) + len(self.groups)


def plan_packing(sides: Sides, traced: TracedStep) -> Packing:
    """Packs the boundary tensors of one dtype and static shape into one when carrying one tensor instead of
    n saves more than the packing costs (the cut-cost constants: each tensor fewer saves CARRY_TENSOR, the
    concat and the split cost two ops and the bytes they copy)."""
    from smartstage.passes.cut_cost import CARRY_PER_KB, CARRY_TENSOR, RECOMPUTE_OP

    graph = traced.concrete.graph
    tensors = [graph.get_tensor_by_name(t) for t in sides.boundary]
    by_dtype: dict[Any, list[int]] = {}
    for k, t in enumerate(tensors):
        if t.dtype in (tf.int32, tf.int64, tf.float32, tf.float64, tf.bool) and t.shape.is_fully_defined():
            by_dtype.setdefault(t.dtype, []).append(k)
    groups = []
    for dtype, members in by_dtype.items():
        kb = sum(tensors[k].shape.num_elements() * dtype.size for k in members) / 1024
        if len(members) > 1 and (len(members) - 1) * CARRY_TENSOR > 2 * RECOMPUTE_OP + 2 * CARRY_PER_KB * kb:
            groups.append(tuple(members))
    packed = {k for g in groups for k in g}
    return Packing(plain=tuple(k for k in range(len(tensors)) if k not in packed), groups=tuple(groups),
                   shapes=tuple(t.shape.as_list() if k in packed else None for k, t in enumerate(tensors)))


def pack(boundary: list, packing: Packing) -> tuple:
    """The dataset element of one batch's boundary tensors (Packing)."""
    element = [boundary[k] for k in packing.plain]
    for group in packing.groups:
        element.append(tf.concat([tf.reshape(boundary[k], [-1]) for k in group], 0))
    return tuple(element)


def unpack(element, packing: Packing) -> list:
    """The boundary tensors, in boundary order, from one dataset element (Packing)."""
    boundary: list = [None] * (len(packing.plain) + sum(len(g) for g in packing.groups))
    for k, value in zip(packing.plain, element):
        boundary[k] = value
    for group, value in zip(packing.groups, element[len(packing.plain):]):
        sizes = [int(np.prod(packing.shapes[k], dtype=np.int64)) for k in group]
        for k, part in zip(group, tf.split(value, sizes, 0)):
            boundary[k] = tf.reshape(part, packing.shapes[k])
    return boundary


def stateless_call(concrete, element) -> Any:
    """`concrete(*element)` as a PartitionedCall op in the function being traced (a dataset's map function).

    A call of a function holding a stateful op is a StatefulPartitionedCall, which tf.data's iterator
    checkpoint refuses whole ("StatefulPartitionedCall is stateful"). The prefetch side holds no state of its
    own: its stateful ops are reads of read-only tables, which tf.data allows in a checkpointed map and checks
    op by op inside the called function when it saves (an op it does not allow still fails the save there,
    by name). So the map calls it as what it is to tf.data, a stateless call, and its iterator saves and
    restores its position as tf.data's own map does.

        before:  dataset.map(lambda *e: body(*e))                    # SerializeIterator: FailedPrecondition
        after:   dataset.map(lambda *e: stateless_call(body_cf, e))   # tf.train.Checkpoint(iterator=...) saves
    """
    from tensorflow.python.eager import context

    # The call options TensorFlow's own call op carries (the Grappler settings of tf.config.optimizer), so the
    # body is optimized exactly as when it is called the usual way.
    options = context.context().function_call_options.as_attrs()
    flat = tf.nest.flatten(element, expand_composites=True)
    results = tf.raw_ops.PartitionedCall(args=list(flat) + list(concrete.captured_inputs),
                                         Tout=[t.dtype for t in concrete.outputs], f=concrete,
                                         config_proto=options["config_proto"], executor_type=options["executor_type"])
    return tf.nest.pack_sequence_as(concrete.structured_outputs, results, expand_composites=True)


def prefetch_function(sides: Sides, traced: TracedStep) -> Callable:
    """The map function: a dataset element in, the boundary tensors out (a tuple, in boundary order).

        before:  train_step(batch)                                  # hashes batch["tags"] itself
        after:   dataset.map(prefetch_function(sides, traced))      # yields (hash:0, label:0, ...)
    """
    captures = _capture_map(sides.prefetch_graph_def, traced)
    kept = {node.name for node in sides.prefetch_graph_def.node}
    inputs = traced.inputs
    extra = list(sides.prefetch_extra)

    passed = [t for t in sides.boundary if parse_tensor_name(t).node in inputs]  # inputs that cross as they are
    computed = [t for t in sides.boundary if t not in passed]

    def prefetch_body(*element):
        flat = tf.nest.flatten(element, expand_composites=True)
        input_map = {f"{name}:0": value for name, value in zip(inputs, flat) if name in kept}
        found = _import(sides.prefetch_graph_def, input_map, captures, computed + extra) if computed or extra else []
        values = dict(zip(computed, found))
        values.update((t, input_map[t]) for t in passed)
        boundary, effects = [values[t] for t in sides.boundary], found[len(computed):]
        if effects:  # moved ops the main side waited for: they run before the batch is handed over
            with tf.control_dependencies(effects):
                boundary = [tf.identity(t) for t in boundary]
        return pack(boundary, packing)

    # Traced once per element structure and called from each map's function: a second dataset.map (a new
    # fit() call, the validation data) does not import the prefetch side again.
    body = tf.function(prefetch_body, autograph=False)

    def prefetch_side(*element):
        return stateless_call(body.get_concrete_function(*element), element)

    packing = plan_packing(sides, traced)
    prefetch_side.packing = packing
    return prefetch_side


def boundary_specs(sides: Sides, traced: TracedStep) -> list[tf.TensorSpec]:
    graph = traced.concrete.graph
    return [tf.TensorSpec(graph.get_tensor_by_name(t).shape, graph.get_tensor_by_name(t).dtype) for t in sides.boundary]


def element_specs(sides: Sides, traced: TracedStep, packing: Packing) -> list[tf.TensorSpec]:
    """The specs of one dataset element: the plain boundary tensors, then each packed group (rank 1)."""
    specs = boundary_specs(sides, traced)
    return [specs[k] for k in packing.plain] + [
        tf.TensorSpec([sum(int(np.prod(packing.shapes[k], dtype=np.int64)) for k in group)], specs[group[0]].dtype)
        for group in packing.groups]


def main_function(sides: Sides, traced: TracedStep, jit_compile: bool | None,
                  packing: Packing | None = None, handles: dict[int, Any] | None = None) -> Callable:
    """The main side as a tf.function of one dataset element (the boundary tensors, packed as `packing`
    says), returning what the step returned. `handles` ({id(captured tensor): stand-in}) runs it on other
    resources than the user's (copies of the variables, smartstage.tf2.step.trial).

        before:  loss = train_step(batch)
        after:   loss = main_function(sides, traced, None)(*element)   # same variables, same updates
    """
    packing = packing or Packing(plain=tuple(range(len(sides.boundary))))
    captures = _capture_map(sides.main_graph_def, traced, handles)
    kept = {node.name for node in sides.main_graph_def.node}
    effects = [op for op in traced.control_outputs if op in kept]
    outputs = list(traced.outputs)
    structure = traced.concrete.structured_outputs

    def main_side(*element):
        boundary = unpack(element, packing)
        input_map = {f"{name}:0": value for name, value in zip(sides.main_inputs, boundary)}
        return _run_imported(sides.main_graph_def, input_map, captures, outputs, effects, structure)

    main_side.__name__ = f"{getattr(traced.function, '__name__', 'step')}_main_side"
    return tf.function(main_side, input_signature=element_specs(sides, traced, packing), jit_compile=jit_compile,
                       autograph=False)


def whole_step_function(traced: TracedStep, handles: dict[int, Any]) -> Callable:
    """The traced step, unsplit, as a tf.function of its flat inputs, on the resources `handles` names
    instead of the user's ({id(captured tensor): stand-in}); the others are the user's, as captured.

        before:  loss = train_step(batch)                                   # on the user's variables
        after:   loss = whole_step_function(traced, copies)(*flat(batch))  # same ops, on the copies
    """
    captures = _capture_map(traced.graph_def, traced, handles)
    outputs = list(traced.outputs)
    placeholders = set(traced.inputs) | {c.placeholder for c in traced.captures}
    effects = [op for op in traced.control_outputs if op not in placeholders]
    structure = traced.concrete.structured_outputs
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in traced.concrete.graph.inputs[:len(traced.inputs)]]

    def whole_step(*flat):
        input_map = {f"{name}:0": value for name, value in zip(traced.inputs, flat)}
        return _run_imported(traced.graph_def, input_map, captures, outputs, effects, structure)

    whole_step.__name__ = f"{getattr(traced.function, '__name__', 'step')}_whole"
    return tf.function(whole_step, input_signature=specs, jit_compile=traced.jit_compile, autograph=False)


__all__ = ["IMPORT_SCOPE", "Packing", "boundary_specs", "element_specs", "main_function", "mapped_dataset", "pack",
           "plan_packing", "prefetch_function", "unpack", "whole_step_function"]
