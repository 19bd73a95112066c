"""functions: the two TF2 functions built from the two sides of a split step.

    prefetch side -> a map function:   dataset.map(prefetch_fn, num_parallel_calls=AUTOTUNE, deterministic=True)
    main side     -> a tf.function:    main_fn(*boundary) runs the rest of the step on the SAME variables

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
from typing import Any, Callable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def, drop_colocation
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.tf2.surgery import Sides
from smartstage.tf2.trace import TracedStep

logger = logging.getLogger(__name__)

IMPORT_SCOPE = "step"


def _capture_map(graph_def: graph_pb2.GraphDef, traced: TracedStep) -> dict[str, Any]:
    """{placeholder tensor: the user's captured tensor} for the captures this side still reads."""
    names = {node.name for node in graph_def.node}
    return {f"{c.placeholder}:0": c.external for c in traced.captures if c.placeholder in names}


def without_mapped(graph_def: graph_pb2.GraphDef, mapped) -> graph_pb2.GraphDef:
    """`graph_def` without the placeholders an import maps (their readers read the mapped tensors) and without
    the placeholders nothing reads (a table's handle once its lookups moved): a placeholder left in a function
    is an op XLA cannot compile (jit_compile=True)."""
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

    def prefetch_side(*element):
        flat = tf.nest.flatten(element, expand_composites=True)
        input_map = {f"{name}:0": value for name, value in zip(inputs, flat) if name in kept}
        found = _import(sides.prefetch_graph_def, input_map, captures, computed + extra) if computed or extra else []
        values = dict(zip(computed, found))
        values.update((t, input_map[t]) for t in passed)
        boundary, effects = [values[t] for t in sides.boundary], found[len(computed):]
        if effects:  # moved ops the main side waited for: they run before the batch is handed over
            with tf.control_dependencies(effects):
                boundary = [tf.identity(t) for t in boundary]
        return tuple(boundary)

    return prefetch_side


def boundary_specs(sides: Sides, traced: TracedStep) -> list[tf.TensorSpec]:
    graph = traced.concrete.graph
    return [tf.TensorSpec(graph.get_tensor_by_name(t).shape, graph.get_tensor_by_name(t).dtype) for t in sides.boundary]


def main_function(sides: Sides, traced: TracedStep, jit_compile: bool | None) -> Callable:
    """The main side as a tf.function of the boundary tensors, returning what the step returned.

        before:  loss = train_step(batch)
        after:   loss = main_function(sides, traced, None)(*boundary)   # same variables, same updates
    """
    captures = _capture_map(sides.main_graph_def, traced)
    view = GraphView(sides.main_graph_def)
    effects = [op for op in traced.control_outputs if op in view]
    outputs = list(traced.outputs)
    structure = traced.concrete.structured_outputs

    def main_side(*boundary):
        input_map = {f"{name}:0": value for name, value in zip(sides.main_inputs, boundary)}
        found = _import(sides.main_graph_def, input_map, captures, outputs + effects)
        values = found[:len(outputs)]
        if effects:  # the step's updates run before its outputs are returned, as in the traced step
            with tf.control_dependencies(found[len(outputs):]):
                values = [tf.identity(v) for v in values]
        if structure is None:
            return None
        return tf.nest.pack_sequence_as(structure, values, expand_composites=True)

    main_side.__name__ = f"{getattr(traced.function, '__name__', 'step')}_main_side"
    return tf.function(main_side, input_signature=boundary_specs(sides, traced), jit_compile=jit_compile,
                       autograph=False)


__all__ = ["IMPORT_SCOPE", "boundary_specs", "main_function", "prefetch_function"]
