"""user_state: the state of the user's program that deciding (analysis, tracing, the timed trial, verify) must
leave as it found it, and the check that it did.

    before:  verdict = time_split(halves, ds)          # a new iterator of ds.shuffle(...) advances its seed
    after:   iteration_changes(ds)                     # "the dataset reshuffles each iteration (ShuffleDataset)..."
             with unchanged(model, ds, "deciding"):    # StateChangedError naming what deciding changed
                 ...

Two guarantees, two tools:
- `iteration_changes(dataset)` says, without reading it, whether creating an iterator of `dataset` changes what
  the next iterator yields: a shuffle that reshuffles each iteration (its seed advances per iterator, so
  `make_csv_dataset` and `Dataset.shuffle` at their defaults), a random dataset that rerandomizes, a function
  that writes state (a `tf.random.Generator`, a Keras `SeedGenerator`, a variable, a mutable table), a source
  a second iterator would consume (a Python generator, a tf.data service job), or a dataset whose inputs the
  walk cannot see. Whatever it names, a trial does not read that dataset.
- `unchanged(...)`, on when the state check is (`check_state=True` or SMARTSTAGE_CHECK_STATE=1), snapshots
  before and compares after: every variable reachable from the model, its optimizer and its metrics, Keras
  `SeedGenerator` states, TensorFlow's global generator and op-seed sequence, Python's and NumPy's global
  generators, the model's compiled state, and whether an iterator was made of a dataset `iteration_changes`
  names. StateChangedError lists each difference.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from smartstage.errors import StateChangedError
from smartstage.graph.op_types import PY_FUNC_OPS

CHECK_STATE_ENV = "SMARTSTAGE_CHECK_STATE"
# The global generators a layer's variable initializers may draw from when a model is built.
BUILD_DRAWN = frozenset({"python random", "numpy random", "tf op-seed sequence", "keras global SeedGenerator"})

# Dataset ops whose source a second iterator would share or consume: Python generators and functions (a
# generator object handed to from_generator yields each element once), and a tf.data service job.
SHARED_SOURCE_OPS = PY_FUNC_OPS | frozenset({"GeneratorDataset", "DataServiceDataset", "DataServiceDatasetV2",
                                             "DataServiceDatasetV3", "DataServiceDatasetV4"})
# Ops in a dataset's functions that advance state shared by every iterator of the dataset.
STATE_WRITING_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin",
    "ResourceScatterMax", "ResourceScatterNdUpdate", "ResourceScatterNdAdd", "ResourceScatterNdSub",
    "RngSkip", "RngReadAndSkip", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
    "LookupTableInsert", "LookupTableInsertV2", "LookupTableRemoveV2", "LookupTableImport", "LookupTableImportV2",
    "InitializeTable", "InitializeTableV2", "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "Assign", "AssignAdd", "AssignSub"})
# Dataset ops (in a dataset's functions, e.g. an interleave's) whose attribute says they draw new seeds per
# iterator.
_RESEEDING_ATTRS = {"ShuffleDatasetV2": None, "ShuffleDatasetV3": "reshuffle_each_iteration",
                    "ShuffleAndRepeatDatasetV2": "reshuffle_each_iteration",
                    "RandomDatasetV2": "rerandomize_each_iteration"}


def _function_graphs(dataset) -> Iterator[Any]:
    for value in vars(dataset).values():
        graph = getattr(getattr(value, "function", None), "graph", None)
        if graph is not None:
            yield graph


def _op_change(graph) -> str | None:
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        if node.op in SHARED_SOURCE_OPS:
            return f"the dataset reads through {node.op}, whose source a trial's iterators would consume"
        if node.op in STATE_WRITING_OPS:
            return f"a function of the dataset writes state ({node.op} {node.name!r}), which every iterator advances"
        if node.op in _RESEEDING_ATTRS:
            attr = _RESEEDING_ATTRS[node.op]
            if attr is None or node.attr[attr].b:
                return f"the dataset draws new seeds per iteration ({node.op} {node.name!r} in a dataset function)"
    return None


def _dataset_change(dataset) -> str | None:
    name = type(dataset).__name__
    if "DataService" in name:
        return f"the dataset reads through {name}, whose source a trial's iterators would consume"
    if getattr(dataset, "_reshuffle_each_iteration", False):
        return (f"the dataset reshuffles each iteration ({name}: a new iterator draws a new order, so reading it "
                "first would change the order training sees); pass reshuffle_each_iteration=False to time it")
    if getattr(dataset, "_rerandomize", False):
        return f"the dataset rerandomizes each iteration ({name})"
    for graph in _function_graphs(dataset):
        found = _op_change(graph)
        if found is not None:
            return found
    return None


def iteration_changes(dataset: tf.data.Dataset) -> str | None:
    """Why creating an iterator of `dataset` changes what its next iterator yields, or None when a fresh
    iterator reads the same elements again from the start. Walks the dataset objects and their functions'
    graphs, not the data (an in-memory array is not serialized); a dataset whose inputs the walk cannot list
    counts as changing.

        before:  tf.data.Dataset.range(8).shuffle(8, reshuffle_each_iteration=False).batch(2)   -> None
        after:   tf.data.Dataset.range(8).shuffle(8).batch(2)   -> "the dataset reshuffles each iteration ..."
    """
    todo, seen = [dataset], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found = _dataset_change(current)
        if found is not None:
            return found
        try:
            todo.extend(current._inputs())
        except (AttributeError, NotImplementedError):
            return (f"the dataset's {type(current).__name__} does not list its inputs, so whether reading it "
                    "changes what it yields next cannot be told")
    return None


def check_state_on(check_state: bool | None) -> bool:
    """The state check's switch: the argument when given, else SMARTSTAGE_CHECK_STATE=1 in the environment."""
    if check_state is not None:
        return bool(check_state)
    return os.environ.get(CHECK_STATE_ENV, "") not in ("", "0", "false", "False")


def _digest(value) -> str:
    array = np.asarray(value)
    return hashlib.blake2b(array.tobytes() + str((array.dtype, array.shape)).encode(), digest_size=16).hexdigest()


def model_state_variables(model) -> list:
    """Every variable of `model`, its optimizer and metrics, and its layers' seed generators, once each."""
    found: dict[int, Any] = {}

    def add(variables) -> None:
        for v in variables or ():
            if hasattr(v, "numpy") or hasattr(v, "value"):
                found.setdefault(id(v), v)

    add(_attribute(model, "variables"))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer_variables = _attribute(optimizer, "variables")
        add(optimizer_variables() if callable(optimizer_variables) else optimizer_variables)
    add(_attribute(model, "metrics_variables"))
    for metric in _attribute(model, "metrics") or ():
        add(_attribute(metric, "variables"))
    for layer in _layers(model):
        for generator in getattr(layer, "_seed_generators", ()) or ():  # Keras 3 SeedGenerator
            add([generator.state])
        for value in vars(layer).values():
            if isinstance(value, tf.random.Generator):
                add([value.state])
            inner = getattr(value, "_generator", None)  # tf_keras backend.RandomGenerator
            if isinstance(inner, tf.random.Generator):
                add([inner.state])
    return list(found.values())


def _attribute(owner, name: str):
    """owner.name, or () where reading it raises: a tf_keras model not built yet has no `variables` to read
    (it raises ValueError), and so nothing of it to compare."""
    try:
        return getattr(owner, name, ())
    except (ValueError, AttributeError, RuntimeError):
        return ()


def _layers(model) -> list:
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is None:
        return [model]
    try:
        return list(flatten(include_self=True, recursive=True))
    except TypeError:
        return [model]


def _value(variable):
    return variable.numpy() if hasattr(variable, "numpy") else variable.value.numpy()


class SavedValues:
    """The variables' values now, to put back exactly (assign writes the saved bits).

        before:  step(batch)                     # updates the variables
        after:   saved = SavedValues(variables); step(batch); saved.restore()   # as they were
    """

    def __init__(self, variables: list):
        self.variables = list(variables)
        self.values = [variable.numpy() for variable in self.variables]

    def restore(self) -> None:
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)


def _global_entries() -> dict[str, str]:
    from tensorflow.python.eager import context
    from tensorflow.python.ops import stateful_random_ops

    entries = {"python random": hashlib.blake2b(repr(random.getstate()).encode(), digest_size=16).hexdigest(),
               "numpy random": hashlib.blake2b(repr(np.random.get_state()).encode(), digest_size=16).hexdigest()}
    ctx = context.context()
    entries["tf global seed"] = repr(ctx._seed)
    rng = getattr(ctx, "_rng", None)
    if rng is not None:
        entries["tf op-seed sequence"] = hashlib.blake2b(repr(rng.getstate()).encode(), digest_size=16).hexdigest()
    generator = getattr(stateful_random_ops, "global_generator", None)
    entries["tf.random global generator"] = "none" if generator is None else _digest(generator.state.numpy())
    try:
        from keras.src.backend.common import global_state

        keras_seed = global_state.get_global_attribute("global_seed_generator")
        entries["keras global SeedGenerator"] = "none" if keras_seed is None else _digest(_value(keras_seed.state))
    except ImportError:  # Keras 3 not importable: nothing of it to keep
        pass
    return entries


def _model_entries(model) -> dict[str, str]:
    entries = {}
    for index, variable in enumerate(model_state_variables(model)):
        name = getattr(variable, "path", None) or getattr(variable, "name", f"variable {index}")
        entries[f"variable {name} [{id(variable)}]"] = _digest(_value(variable))
    compiled = getattr(model, "compiled", getattr(model, "_is_compiled", None))
    entries["model compiled"] = repr(compiled)
    entries["model optimizer"] = repr(id(getattr(model, "optimizer", None)))
    entries["model loss"] = repr(id(getattr(model, "loss", None)))
    return entries


@dataclass(frozen=True)
class Snapshot:
    """Digests of the user's state at one moment: name -> digest."""

    entries: tuple[tuple[str, str], ...]

    def differences(self, later: "Snapshot") -> list[str]:
        """What changed from this snapshot to `later`. State created in between is not a difference: a model
        that deciding built (tracing its step creates its variables, exactly as model.fit's own first trace
        would, with the same initializer draws in the same order) has new variables, and the generators
        their initializers draw from (BUILD_DRAWN) moved for them; those are not compared then."""
        after = dict(later.entries)
        built = any(name.startswith("variable ") and name not in dict(self.entries) for name in after)
        return [name for name, digest in self.entries
                if name in after and after[name] != digest and not (built and name in BUILD_DRAWN)]


def snapshot(model=None, roots: tuple = ()) -> Snapshot:
    """The user's state now: the global generators and seeds, and every variable of `model` and `roots`."""
    entries = _global_entries()
    for owner in ([model] if model is not None else []) + list(roots):
        entries.update(_model_entries(owner))
    return Snapshot(tuple(sorted(entries.items())))


@contextlib.contextmanager
def _counting_iterators(dataset) -> Iterator[list]:
    """For the duration, every iterator made of `dataset` or of a dataset built on it, recorded by type name."""
    from tensorflow.python.data.ops import dataset_ops

    made: list[str] = []
    original = dataset_ops.DatasetV2.__iter__

    def built_on(candidate) -> bool:
        todo, seen = [candidate], set()
        while todo:
            current = todo.pop()
            if current is dataset:
                return True
            if id(current) in seen:
                continue
            seen.add(id(current))
            try:
                todo.extend(current._inputs())
            except (AttributeError, NotImplementedError):
                pass
        return False

    def counted(self):
        if built_on(self):
            made.append(type(self).__name__)
        return original(self)

    dataset_ops.DatasetV2.__iter__ = counted
    try:
        yield made
    finally:
        dataset_ops.DatasetV2.__iter__ = original


@contextlib.contextmanager
def unchanged(what: str, model=None, datasets: tuple = (), roots: tuple = (), *, on: bool = True) -> Iterator[None]:
    """Runs the block, then, when `on`, raises StateChangedError if it changed the user's state: a variable of
    `model` or `roots`, a global generator or seed, or the next iteration of one of `datasets` (an iterator
    made of a dataset whose iteration changes what it yields next).

        before:  halves = split_model_step(model, ...)
        after:   with unchanged("deciding the split", model, (dataset,)):  halves = split_model_step(model, ...)
    """
    if not on:
        yield
        return
    before = snapshot(model, roots)
    changing = [(d, iteration_changes(d)) for d in datasets if d is not None]
    changing = [(d, why) for d, why in changing if why is not None]
    with contextlib.ExitStack() as stack:
        counts = [(why, stack.enter_context(_counting_iterators(d))) for d, why in changing]
        yield
    problems = before.differences(snapshot(model, roots))
    problems += [f"{len(made)} iterator(s) of a dataset whose next iteration that changes ({why})"
                 for why, made in counts if made]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise StateChangedError(f"{what} changed the user's state: {shown}; report this as a SmartStage bug, and "
                                "train with measure=False meanwhile")


__all__ = ["CHECK_STATE_ENV", "SHARED_SOURCE_OPS", "STATE_WRITING_OPS", "SavedValues", "Snapshot", "check_state_on",
           "iteration_changes", "model_state_variables", "snapshot", "unchanged"]
