"""trace: the user's `tf.function` step traced once for what the dataset yields, checked, and read as a GraphDef.

    before:  step = tf.function(train_step); ds = tf.data.Dataset...
    after:   traced = trace_step(step, ds.element_spec)
             traced.graph_def, traced.inputs ("batch", "batch_1"), traced.captures, traced.targets

A step is called the way `tf.data` calls a map function: `step(element)`, or `step(*element)` when the
element is a tuple and the step takes that many arguments. Checks that raise SplitError, before anything
is built: the step is not a `tf.function`; the element spec does not fit its signature; its graph changes
from one trace to the next (it reads Python state); `jit_compile=True` on a step with string ops.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from smartstage.errors import SplitError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capture:
    """One captured tensor of the step: the outer value and the placeholder node that stands for it inside."""

    placeholder: str  # node name inside the function graph
    external: Any  # the EagerTensor (a variable's or a table's resource handle, or a captured value)
    dtype: tf.DType


@dataclass(frozen=True)
class TracedStep:
    """The step's function graph, as the partition and the two new functions need it."""

    function: Any  # the user's tf.function
    concrete: Any  # its ConcreteFunction for the dataset's element spec
    graph_def: graph_pb2.GraphDef
    unpack: bool  # the step is called step(*element)
    inputs: tuple[str, ...]  # placeholder node of each flat data input, in nest.flatten order
    captures: tuple[Capture, ...]
    outputs: tuple[str, ...]  # the tensors the step returns, flat
    control_outputs: tuple[str, ...]  # the ops the step runs for their effects (updates, prints)
    variables: tuple[Any, ...]  # the tf.Variables the step captures
    jit_compile: bool | None

    @property
    def targets(self) -> list[str]:
        """What the training step runs: its outputs, and the control outputs it runs for their effects
        (updates, prints). A FuncGraph lists every stateful op as a control output, reads, lookups and
        checks too: those are no targets. A read serves its readers; an Assert (or a functional op such as
        assert_*'s AssertGuard) is judged by the partition by what it runs, and wherever it lands it runs
        once per batch (smartstage.graph.rewrites re-routes its control edges)."""
        from smartstage.graph.op_types import (FUNCTIONAL_OPS, MOVABLE_STATEFUL_OPS, ORDER_FREE_STATEFUL_OPS,
                                               TABLE_READ_OPS, VARIABLE_READ_OPS)

        graph = self.concrete.graph
        reads = VARIABLE_READ_OPS | TABLE_READ_OPS | MOVABLE_STATEFUL_OPS | FUNCTIONAL_OPS | (
            ORDER_FREE_STATEFUL_OPS - {"Print", "PrintV2"})
        effects = [n for n in self.control_outputs if graph.get_operation_by_name(n).type not in reads]
        names = [t.rpartition(":")[0] for t in self.outputs] + effects
        return list(dict.fromkeys(n for n in names if n not in self.inputs))


def _name(step) -> str:
    return getattr(step, "__name__", None) or getattr(getattr(step, "python_function", None), "__name__", "step")


def check_is_function(step) -> None:
    if not callable(getattr(step, "get_concrete_function", None)) or not hasattr(step, "python_function"):
        raise SplitError(f"split(): {_name(step)!r} is a plain Python callable ({type(step).__name__}), not a "
                         "tf.function; decorate the training step with @tf.function (a Python step runs its side "
                         "effects every call, a traced one only when traced, so SmartStage splits traced steps only)")


def _unpack(step, element_spec) -> bool:
    """Whether the step takes the element's components as separate arguments (tf.data's map convention)."""
    if not isinstance(element_spec, tuple) or len(element_spec) < 2:
        return False
    try:
        params = inspect.signature(step.python_function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return varargs or len(positional) >= len(element_spec)


def _dataset_keys(element_spec) -> list[str]:
    """Every key of the element's dicts, as a path ("features/city" for a key of a nested dict)."""
    keys = []

    def walk(spec, prefix: str) -> None:
        if isinstance(spec, dict):
            for k, v in spec.items():
                keys.append(f"{prefix}{k}")
                walk(v, f"{prefix}{k}/")
        elif isinstance(spec, (tuple, list)):
            for v in spec:
                walk(v, prefix)

    walk(element_spec, "")
    return keys


def _missing_key(error: KeyError) -> str:
    """The key a step's trace failed on (autograph rewraps the KeyError with the traceback in its message)."""
    import re

    found = re.findall(r"KeyError: (.+)", str(error))
    return found[-1].strip() if found else (repr(error.args[0]) if error.args else "?")


def _last_line(error: Exception) -> str:
    """The error's own message: autograph puts "in user code:" and a traceback before it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def untouched_copy(step):
    """A tf.function of `step`'s Python function with `step`'s options: tracing it leaves `step`'s own traces
    as they were. A trace for the dataset's element_spec left in `step`'s cache would serve the user's later
    calls on concrete batches, which otherwise trace for each batch shape: another program, with other values
    (a mean's gradient divides by a computed row count instead of a constant that constant folding turns into
    a multiplication by its reciprocal; one set of random ops serves every batch shape).

        before:  step.get_concrete_function(spec)                 # step(batch) now runs this trace
        after:   untouched_copy(step).get_concrete_function(spec)  # step(batch) traces as it would have
    """
    clone = getattr(step, "_clone", None)
    if callable(clone):
        return clone(None)
    return tf.function(step.python_function, jit_compile=getattr(step, "_jit_compile", None))


def _concrete(step, element_spec, unpack: bool):
    args = tuple(element_spec) if unpack else (element_spec,)
    try:
        return step.get_concrete_function(*args)
    except KeyError as e:
        keys = _dataset_keys(element_spec)
        raise SplitError(
            f"split(): {_name(step)!r} reads key {_missing_key(e)} that the dataset's elements do not have (their "
            f"keys: {', '.join(map(repr, keys)) if keys else 'none: the elements are not dicts'}); map the dataset "
            "to the keys the step reads, or read one of these") from None
    except (TypeError, ValueError) as e:
        declared = step.input_signature
        raise SplitError(
            f"split(): the dataset's element_spec {element_spec!r} does not fit the signature of {_name(step)!r}"
            + (f" (input_signature {declared!r})" if declared is not None else "")
            + f": {_last_line(e)}; map the dataset to what the step takes, or fix the step's "
              "input_signature") from None


def _graph_key(graph_def: graph_pb2.GraphDef) -> list:
    """What two traces of a deterministic step share: every node's op, inputs (by position: captured
    placeholders are named after resource ids) and constant value, and its name for the error message."""
    from smartstage.graph.names import input_source

    index = {node.name: i for i, node in enumerate(graph_def.node)}
    key = []
    for node in graph_def.node:
        value = node.attr["value"].SerializeToString(deterministic=True) if node.op == "Const" else b""
        inputs = tuple((index.get(input_source(s), s), s.startswith("^"), s.rpartition(":")[2] if ":" in s else "")
                       for s in node.input)
        key.append((node.op, inputs, value, node.name))
    return key


def _check_retrace(step, concrete, element_spec, unpack: bool) -> None:
    """SplitError when two traces of the step give different graphs: the step reads Python state (a counter,
    a Python random number, the time), which a split program would freeze at the first trace."""
    def fresh_key() -> list:
        return _graph_key(_concrete(untouched_copy(step), element_spec, unpack).graph.as_graph_def())

    first_key, second_key = _graph_key(concrete.graph.as_graph_def()), fresh_key()
    if [k[:3] for k in first_key] != [k[:3] for k in second_key]:
        # A first trace may create state (an optimizer's slots) that later traces find: judge two later ones.
        first_key, second_key = second_key, fresh_key()
    if [k[:3] for k in first_key] != [k[:3] for k in second_key]:
        changed = next((a for a, b in zip(first_key, second_key) if a[:3] != b[:3]), None)
        where = f" (first difference at node {changed[3]!r})" if changed else ""
        raise SplitError(f"split(): {_name(step)!r} traces to a different graph each time{where}: it depends on "
                         "Python state (a counter, random.random(), time.time() ...), which runs only when traced; "
                         "keep such state in a tf.Variable or pass it as an argument")


def _string_ops(graph_def: graph_pb2.GraphDef) -> list[str]:
    from smartstage.graph.op_types import output_dtypes

    found = []
    for node in graph_def.node:
        if node.op in ("Placeholder", "Const"):
            continue
        types = output_dtypes(node) or []
        if types_pb2.DT_STRING in types or node.op.startswith(("String", "Substr", "RegexReplace", "DecodeCSV")):
            found.append(node.name)
    return found


def _table_ops(graph_def: graph_pb2.GraphDef) -> list[str]:
    from smartstage.graph.op_types import MUTABLE_STATE_OPS, READ_ONLY_TABLE_OPS, TABLE_READ_OPS

    table_ops = TABLE_READ_OPS | READ_ONLY_TABLE_OPS | MUTABLE_STATE_OPS | {"LookupTableImportV2", "LookupTableExportV2"}
    return [node.name for node in graph_def.node if node.op in table_ops]


def _check_jit(step, graph_def: graph_pb2.GraphDef) -> None:
    """SplitError for a step compiled with XLA (jit_compile=True) that has ops XLA cannot compile: string ops
    and table lookups. The unsplit step fails at its first call; split() compiles the main side only."""
    for found, what in ((_string_ops(graph_def), "string ops"), (_table_ops(graph_def), "table lookups")):
        if found:
            raise SplitError(
                f"split(): {_name(step)!r} has jit_compile=True and {what} XLA cannot compile ({found[0]!r}"
                f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}); the unsplit step fails under XLA at "
                "its first call: decorate the step with @tf.function (no jit_compile) and pass jit_compile=True to "
                "split() to compile the main side only (the input pipeline, where they move, is not compiled)")


def trace_step(step, element_spec, *, check_retrace: bool = True) -> TracedStep:
    """The step traced for `element_spec`, with its inputs, captures and outputs named as in its GraphDef.

        before:  step.get_concrete_function(ds.element_spec).graph   # a FuncGraph
        after:   trace_step(step, ds.element_spec).graph_def          # plus inputs, captures, targets
    """
    check_is_function(step)
    unpack = _unpack(step, element_spec)
    concrete = _concrete(untouched_copy(step), element_spec, unpack)
    if check_retrace:
        _check_retrace(step, concrete, element_spec, unpack)
    graph = concrete.graph
    graph_def = graph.as_graph_def()
    jit = getattr(step, "_jit_compile", None)
    if jit:
        _check_jit(step, graph_def)
    n_data = len(tf.nest.flatten(concrete.structured_input_signature, expand_composites=True))
    inputs = tuple(t.op.name for t in graph.inputs[:n_data])
    captured = {id(internal): external for external, internal in graph.captures}
    captures = tuple(Capture(t.op.name, captured[id(t)], t.dtype) for t in graph.inputs[n_data:] if id(t) in captured)
    return TracedStep(
        function=step, concrete=concrete, graph_def=graph_def, unpack=unpack, inputs=inputs, captures=captures,
        outputs=tuple(t.name for t in graph.outputs), control_outputs=tuple(op.name for op in graph.control_outputs),
        variables=tuple(graph.variables), jit_compile=jit)
