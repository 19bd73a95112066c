"""state: what each captured tensor of a TF2 step is, and whether the prefetch side may read it.

A `tf.function` sees variables, tables and captured values only as resource (or value) placeholders in its
FuncGraph. The partition judges nodes by op type, so the analysis graph names each capture by what it
stands for, the way a v1 graph would have it:

    capture                                          stand-in in the analysis graph    verdict
    a variable the step writes, or a trainable one   VarHandleOp                      pinned: reads variable
    a read-only variable (not trainable, only read)  its reads become Const           free: may move
    a StaticHashTable (only looked up)               HashTableV2                      free: lookups may move
    any other table                                  MutableHashTableV2               pinned: mutable state
    a captured value (a constant tensor)             Const                            free
    another resource (an iterator, a generator ...)  Placeholder (as traced)          pinned: fed

A read-only variable is read on the prefetch side when the batch is prepared, up to the prefetch depth
ahead of the step: that equals the step's own read only while nothing writes it during training (an
adapted Normalization's mean and variance). `read_only=False` in split() pins every variable.

Stateful random ops (RandomUniform ...) pin too: in a parallel `map` the order in which batches draw from
one op's sequence is not the step order, and a new iterator restarts the sequence. They get a control
input from one stand-in VarHandleOp, RANDOM_STATE, so their pin reads "reads variable 'smartstage/random_state'".
"""

from __future__ import annotations

import gc
import logging
from collections import deque
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, node_def_pb2, tensor_pb2

from smartstage.graph.op_types import RANDOM_OPS, TABLE_HANDLE_OPS, TABLE_READ_OPS
from smartstage.tf2.step.trace import TracedStep

logger = logging.getLogger(__name__)

RANDOM_STATE = "smartstage/random_state"

VARIABLE, READ_ONLY_VARIABLE, READ_ONLY_TABLE, TABLE, VALUE, OTHER = (
    "variable", "read_only_variable", "read_only_table", "table", "value", "other")


@dataclass(frozen=True)
class CapturedState:
    """One capture of the step: its placeholder node, what it is, and why."""

    placeholder: str
    kind: str  # VARIABLE, READ_ONLY_VARIABLE, READ_ONLY_TABLE, TABLE, VALUE, OTHER
    name: str  # the variable's or table's name, or the placeholder's
    reason: str

    @property
    def movable(self) -> bool:
        return self.kind in (READ_ONLY_VARIABLE, READ_ONLY_TABLE, VALUE)


def static_tables(roots) -> dict[int, object]:
    """id(resource handle) -> StaticHashTable, for every static table reachable from `roots` through object
    attributes, lists, tuples and dicts (a model's layers, a module's tables, a step's closure)."""
    from tensorflow.python.ops import lookup_ops

    found: dict[int, object] = {}
    seen: set[int] = set()
    # Breadth first: a model's layers (where its tables are) come before the depths of what else it holds.
    todo = deque((r, 0) for r in roots)
    while todo and len(seen) < 50_000:
        obj, depth = todo.popleft()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, tf.Tensor,
                                                             tf.distribute.Strategy, tf.distribute.StrategyExtended)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (lookup_ops.StaticHashTable, lookup_ops.StaticVocabularyTable)):
            try:
                found[id(obj.resource_handle)] = obj
            except (AttributeError, ValueError, TypeError):
                pass
        if depth >= 8:
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            children = list(obj)
        else:
            children = _attributes(obj)
        todo.extend((c, depth + 1) for c in children[:10_000])  # a large data list holds no table
    return found


def _attributes(obj) -> list:
    """The attribute values of a plain object; nothing for modules, classes, tensors and lazy proxies (a
    Keras LazyModule raises ImportError on any attribute)."""
    if isinstance(obj, (type, type(gc))) or type(obj).__name__ == "LazyModule":
        return []
    try:
        if callable(getattr(obj, "numpy", None)):
            return []
        return list(vars(obj).values())
    except Exception:  # an object whose attributes cannot be read is no table holder
        return []


def step_roots(step) -> list:
    """Where a step's tables live: its closure, the object it is a method of, and the globals it names."""
    fn = getattr(step, "python_function", step)
    roots = [getattr(fn, "__self__", None)]
    inner = getattr(fn, "__func__", fn)
    roots.extend(c.cell_contents for c in (getattr(inner, "__closure__", None) or ()) if _filled(c))
    code = getattr(inner, "__code__", None)
    module_globals = getattr(inner, "__globals__", {})
    if code is not None:
        roots.extend(module_globals[n] for n in code.co_names if n in module_globals)
    return [r for r in roots if r is not None and not isinstance(r, type(gc))]


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _attr_type(dtype: tf.DType) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(type=dtype.as_datatype_enum)


def _stand_in(name: str, op: str, **attrs) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def _const(name: str, dtype: int) -> node_def_pb2.NodeDef:
    value = attr_value_pb2.AttrValue(tensor=tensor_pb2.TensorProto(dtype=dtype))
    return _stand_in(name, "Const", dtype=attr_value_pb2.AttrValue(type=dtype), value=value)


def readers_of(graph: tf.Graph) -> dict[str, list[tf.Operation]]:
    """{op name: the ops that read it, through data or control edges, each once, in graph order}, read from the
    step's FuncGraph (its GraphDef has the same nodes under the same names)."""
    readers: dict[str, dict[str, tf.Operation]] = {}
    for op in graph.get_operations():
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            readers.setdefault(source.name, {})[op.name] = op
    return {name: list(ops.values()) for name, ops in readers.items()}


def classify(traced: TracedStep, tables: dict[int, object], read_only: bool,
             readers: dict[str, list[tf.Operation]] | None = None) -> list[CapturedState]:
    """What each capture of `traced` is (see the module docstring). `readers`: readers_of(the step's graph),
    when the caller has it."""
    variables = {id(v.handle): v for v in traced.variables if hasattr(v, "handle")}
    if readers is None:
        readers = readers_of(traced.concrete.graph)
    states = []
    for capture in traced.captures:
        ph = capture.placeholder
        reader_types = {op.type for op in readers.get(ph, ())}
        variable = variables.get(id(capture.external))
        table = tables.get(id(capture.external))
        if variable is not None:
            name = variable.name
            if not read_only:
                states.append(CapturedState(ph, VARIABLE, name, "split(read_only=False) pins every variable"))
            elif variable.trainable:
                states.append(CapturedState(ph, VARIABLE, name, f"variable {name!r} is trainable"))
            elif reader_types - {"ReadVariableOp"}:
                ops = ", ".join(sorted(reader_types - {"ReadVariableOp"}))
                states.append(CapturedState(ph, VARIABLE, name, f"the step writes or passes on {name!r} ({ops})"))
            else:
                states.append(CapturedState(ph, READ_ONLY_VARIABLE, name,
                                            f"{name!r} is not trainable and the step only reads it"))
        elif capture.dtype == tf.resource and table is not None and not reader_types - TABLE_READ_OPS:
            states.append(CapturedState(ph, READ_ONLY_TABLE, _table_name(table), "a StaticHashTable, only looked up"))
        elif capture.dtype == tf.resource and reader_types and reader_types <= TABLE_HANDLE_OPS:
            states.append(CapturedState(ph, TABLE, ph, "a lookup table that is not a StaticHashTable the step "
                                        "can reach, or that the step writes"))
        elif capture.dtype != tf.resource and capture.dtype != tf.variant:
            states.append(CapturedState(ph, VALUE, ph, "a captured value, fixed when traced"))
        else:
            states.append(CapturedState(ph, OTHER, ph, f"a captured {capture.dtype.name} of unknown kind"))
    return states


def _table_name(table) -> str:
    return getattr(table, "name", None) or type(table).__name__


def stand_in_name(state: CapturedState, taken) -> str:
    """The analysis graph's name for a variable or table capture: what the user named it ("captured/embedding"),
    so a pin reads "reads variable 'captured/embedding'" instead of naming a placeholder after a resource id."""
    if state.kind not in (VARIABLE, READ_ONLY_VARIABLE, READ_ONLY_TABLE, TABLE) or state.name == state.placeholder:
        return state.placeholder
    base = "captured/" + "".join(c if c.isalnum() or c in "._-/" else "_" for c in state.name.rpartition(":0")[0]
                                 or state.name)
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def stand_ins(traced: TracedStep, states: list[CapturedState], tables: dict[int, object],
              readers: dict[str, list[tf.Operation]]) -> tuple[list[node_def_pb2.NodeDef], dict[str, str]]:
    """The nodes that take the place of nodes of the step's graph (module docstring), and the new name of
    each capture placeholder that gets one (stand_in_name). `readers`: readers_of(the step's graph)."""
    graph = traced.concrete.graph
    by_placeholder = {c.placeholder: c for c in traced.captures}
    nodes, renamed, taken = [], {}, {op.name for op in graph.get_operations()}
    for state in states:
        ph = state.placeholder
        name = renamed[ph] = stand_in_name(state, taken)
        if state.kind in (VARIABLE, READ_ONLY_VARIABLE):
            nodes.append(_stand_in(name, "VarHandleOp", dtype=_attr_type(tf.float32),
                                   shared_name=attr_value_pb2.AttrValue(s=state.name.encode())))
        if state.kind == READ_ONLY_VARIABLE:
            for reader in readers.get(ph, ()):
                const = _const(reader.name, reader.get_attr("dtype").as_datatype_enum)
                const.input.extend(f"^{c.name}" for c in reader.control_inputs)
                nodes.append(const)
        elif state.kind in (READ_ONLY_TABLE, TABLE):
            table = tables.get(id(by_placeholder[ph].external))
            key, value = (table.key_dtype, table.value_dtype) if table is not None else (tf.string, tf.int64)
            op = "HashTableV2" if state.kind == READ_ONLY_TABLE else "MutableHashTableV2"
            nodes.append(_stand_in(name, op, key_dtype=_attr_type(key), value_dtype=_attr_type(value),
                                   shared_name=attr_value_pb2.AttrValue(s=state.name.encode())))
        elif state.kind == VALUE:
            nodes.append(_const(ph, graph.get_operation_by_name(ph).get_attr("dtype").as_datatype_enum))
    return nodes, {old: new for old, new in renamed.items() if old != new}


def random_state(traced: TracedStep) -> tuple[list[node_def_pb2.NodeDef], dict[str, tuple[str, ...]]]:
    """One stand-in state node, and a control input from it for every stateful random op of the step: they
    pin (module docstring). ([], {}) when the step has none."""
    randoms = [op.name for op in traced.concrete.graph.get_operations() if op.type in RANDOM_OPS]
    if not randoms:
        return [], {}
    node = _stand_in(RANDOM_STATE, "VarHandleOp", dtype=_attr_type(tf.int64),
                     shared_name=attr_value_pb2.AttrValue(s=b"random_state"))
    return [node], {name: (RANDOM_STATE,) for name in randoms}


__all__ = ["CapturedState", "classify", "random_state", "readers_of", "stand_in_name", "stand_ins", "static_tables",
           "step_roots", "RANDOM_STATE"]
