"""replicas: a Keras model's own train (or test) step split under tf.distribute.MirroredStrategy.

    before:  with strategy.scope(): model = Ranker();   model.fit(ds)        # each replica preprocesses its slice
    after:   with strategy.scope(): model = Ranker();   ss.tf2.fit(model, ds)  # the distributed dataset does it

Under a strategy Keras runs the step once per replica, in replica context, and the step's own code all-reduces
the gradients, scales the loss by the number of replicas and updates mirrored variables. The main side must
therefore be the model's step traced by Keras in each replica, not a graph imported once. So:

1. Reference: the step traced for all replicas at once (`strategy.run` in one tf.function, each replica fed
   its own slice of the batch), partitioned by the engine of ss.tf2.split with every variable pinned.
   Replica 0's moved ops, cut out, are the prefetch side: one replica's raw slice in, its boundary out.
2. Dataset: the raw batches rebatched into per-replica slices exactly as `experimental_distribute_dataset`
   slices them, mapped by the prefetch side, then handed to the strategy replica by replica
   (`distribute_datasets_from_function`), so replica r gets the boundary of the slice it would have got.
3. Main side (`ReplicaStep`): Keras calls it per replica with that replica's boundary. It runs the model's
   own step on stand-ins of the raw slice, and while the step is traced an op callback hands every op that
   reads a boundary tensor the prefetched value in its place. Ops are matched to the reference by
   structure (op type, attributes, matched inputs), never by name. Afterwards every op that still reads a
   stand-in must be a moved op of the reference, whose value nothing reads; else SplitError. The stand-ins
   never reach what the step computes or returns.

Stateful moved ops left behind (a table lookup) would still run; their inputs are re-pointed at empty
stand-ins, so they run on nothing and the dead ops above them are pruned by the function runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf

from smartstage.errors import NothingToMoveError, SplitError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.tf2.analysis import Analysis, analyse
from smartstage.tf2.functions import Packing, element_specs, mapped_dataset, prefetch_function, unpack
from smartstage.tf2.split import SplitStep
from smartstage.tf2.state import static_tables
from smartstage.tf2.surgery import Sides, cut
from smartstage.tf2.trace import TracedStep, trace_step

logger = logging.getLogger(__name__)

Key = Any  # a structural key: ("in", k) | ("cap", id) | (op type, attributes, input keys), then an output port


def per_replica_dataset(strategy, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`'s batches cut into one slice per replica, rows in order, as `experimental_distribute_dataset`
    cuts them for one worker's replicas: a batch of n rows gives each replica ceil(n / replicas) rows, the last
    ones what is left (maybe none), and replica r gets element k * replicas + r. (The tests hold this against
    the dataset tf.distribute itself builds.)

        before:  strategy.experimental_distribute_dataset(ds)      # batches of 8 -> two replicas of 4
        after:   per_replica_dataset(strategy, ds)                 # slices of 4, replica 0's first
    """
    replicas = strategy.num_replicas_in_sync
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)) or spec.shape.rank == 0:
            raise SplitError(f"fit(): the dataset yields {spec!r}, which is not a batch of rows that "
                             f"{type(strategy).__name__} can cut among its replicas; yield batched dense or ragged "
                             "tensors (dataset.batch(n))")

    def slices(*element):
        element = element[0] if len(element) == 1 else element
        first = tf.nest.flatten(element)[0]
        rows = first.nrows(out_type=tf.int64) if isinstance(first, tf.RaggedTensor) else tf.shape(
            first, out_type=tf.int64)[0]
        size = (rows + replicas - 1) // replicas

        def replica_slice(r):
            start, stop = tf.minimum(r * size, rows), tf.minimum((r + 1) * size, rows)
            return tf.nest.map_structure(lambda t: t[start:stop], element)

        return tf.data.Dataset.range(replicas).map(replica_slice)

    return dataset.flat_map(slices)


@contextlib.contextmanager
def distributing(strategy, replaced: dict[int, tf.data.Dataset]):
    """For the duration, Keras's `strategy.experimental_distribute_dataset(raw)` of a dataset in `replaced`
    ({id(raw dataset): its per-replica mapped dataset}) hands out the mapped one instead, element k *
    replicas + r to replica r. Keras keeps the raw dataset for everything else (its element spec, steps per
    epoch, a new iterator each epoch), exactly as model.fit has it.

        before:  model.fit(raw)        # Keras: strategy.experimental_distribute_dataset(raw)
        after:   with distributing(strategy, {id(raw): mapped}): model.fit(raw)
    """
    missing = object()
    own = strategy.__dict__.get("experimental_distribute_dataset", missing)
    original = strategy.experimental_distribute_dataset

    def experimental_distribute_dataset(dataset, options=None):
        mapped = replaced.get(id(dataset))
        if mapped is None:
            return original(dataset, options)
        return strategy.distribute_datasets_from_function(lambda context: mapped, options)

    object.__setattr__(strategy, "experimental_distribute_dataset", experimental_distribute_dataset)
    try:
        yield
    finally:
        if own is missing:
            strategy.__dict__.pop("experimental_distribute_dataset", None)
        else:
            object.__setattr__(strategy, "experimental_distribute_dataset", own)


# ---------------------------------------------------------------------------------------------- structural keys

def _attributes(node_def) -> tuple:
    """The attributes that decide what an op computes (names, devices and private `_` attributes do not)."""
    return tuple(sorted((k, v.SerializeToString(deterministic=True)) for k, v in node_def.attr.items()
                        if not k.startswith("_")))


def reference_keys(view: GraphView, received: dict[str, int], captures: dict[str, int],
                   nodes: set[str]) -> dict[str, Key]:
    """{node: key} for `nodes` of the reference graph and their ancestors; `received` names the tensors the
    step got ({tensor: flat input index}), `captures` the captured placeholders ({node: capture_key})."""
    keys: dict[str, Key] = {}

    def tensor_key(tensor: str) -> Key:
        t = parse_tensor_name(tensor)
        if str(t) in received:
            return ("in", received[str(t)])
        node_key = key_of(t.node)
        return None if node_key is None else (node_key, t.port)

    def key_of(name: str) -> Key:
        if name in keys:
            return keys[name]
        keys[name] = None  # a cycle (loop) keys to None
        if name in captures:
            keys[name] = captures[name]
            return keys[name]
        node = view.node(name)
        if node.op == "Placeholder":
            return None
        inputs = tuple(tensor_key(s) for s in node.input if not s.startswith("^"))
        keys[name] = None if any(k is None for k in inputs) else _op_key(node, inputs)
        return keys[name]

    for name in sorted(nodes):
        key_of(name)
    return keys


def _value_key(array) -> Key:
    return ("value", array.dtype.str, tuple(array.shape), array.tobytes() if array.dtype != object else
            tuple(array.ravel().tolist()))


def _op_key(node_def, inputs: tuple) -> Key:
    """An op's key from its NodeDef and its inputs' keys; a constant is keyed by its value, as a captured
    value is (a trace inlines a small captured tensor as a Const)."""
    if node_def.op == "Const":
        return _value_key(tf.make_ndarray(node_def.attr["value"].tensor))
    return (node_def.op, _attributes(node_def), inputs)


def capture_key(external) -> Key:
    """A captured value's key: a resource by identity (the same table in every replica), a value by its
    contents (a trace may capture a fresh copy of a constant)."""
    if getattr(external, "dtype", None) == tf.resource or not hasattr(external, "numpy"):
        return ("cap", id(external))
    return _value_key(external.numpy())


def _external(tensor) -> Any:
    """The value a captured placeholder stands for, through nested function graphs; None if not a capture."""
    graph = tensor.graph
    while hasattr(graph, "captures"):
        found = next((ext for ext, internal in graph.captures if internal is tensor), None)
        if found is None:
            return None
        if not hasattr(found, "graph") or not hasattr(found.graph, "captures"):
            return found  # an eager tensor (a resource handle or a captured value)
        tensor, graph = found, found.graph
    return tensor


# ---------------------------------------------------------------------------------------------- the split

@dataclass(frozen=True)
class ReplicaPlan:
    """What the main side needs to recognise the moved ops in each replica's trace of the step."""

    moved_keys: frozenset  # keys of replica 0's moved ops
    boundary: dict  # {tensor key: boundary index}
    passed: dict  # {flat input index: boundary index} for inputs that cross as they are
    input_specs: tuple  # the flat spec of one replica's raw slice
    structure: Any  # its nest structure (element_spec)
    element_specs: tuple = ()  # the specs of one mapped element (the boundary, packed)


def trace_replicated(model, method: str, spec, strategy, autograph: bool) -> tuple[TracedStep, dict]:
    """The model's step traced for every replica at once (strategy.run in one tf.function), each replica fed
    its own slice; and {replica: [the flat tensors its step received]}."""
    replicas = strategy.num_replicas_in_sync
    impl = getattr(type(model), method)
    ref = weakref.ref(model)
    received: dict[int, list[str]] = {}

    def on_replica(data):
        replica = int(tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group))
        received[replica] = [t.name for t in tf.nest.flatten(data, expand_composites=True)]
        return impl(ref(), tf.nest.map_structure(lambda t: t, data))

    def replicated_step(batches):
        values = strategy.experimental_distribute_values_from_function(
            lambda context: batches[context.replica_id_in_sync_group])
        outputs = strategy.run(on_replica, args=(values,))
        return [strategy.experimental_local_results(o) for o in tf.nest.flatten(outputs)]

    replicated_step.__name__ = f"{type(model).__name__}_{method}_replicated"
    step = tf.function(replicated_step, autograph=autograph)
    traced = trace_step(step, tuple([spec] * replicas), check_retrace=True)
    return traced, received


def _replica_zero(traced: TracedStep, analysis: Analysis, received: dict, flat_width: int):
    """Replica 0's moved ops and boundary: those whose inputs come from replica 0's slice only."""
    view = GraphView(traced.graph_def)
    groups = [set(traced.inputs[r * flat_width:(r + 1) * flat_width]) for r in range(len(received))]
    others = set().union(*groups[1:])
    zero_device = {view.node(parse_tensor_name(t).node).device for t in received[0]}
    partition = analysis.partition
    boundary = []
    for tensor in partition.boundary_after:
        node = parse_tensor_name(tensor).node
        ancestry = view.ancestors([node]) | {node}
        if ancestry & others:
            continue
        if ancestry & groups[0] or view.node(node).device in zero_device:
            boundary.append(tensor)
    moved_set = set(partition.moved)
    needed = view.ancestors([parse_tensor_name(t).node for t in boundary]) | {parse_tensor_name(t).node
                                                                            for t in boundary}
    moved = tuple(n for n in partition.moved if n in needed and n in moved_set)
    return view, moved, tuple(boundary)


def _without_devices(graph_def):
    """The prefetch side runs in tf.data's threads on the host: replica 0's device placement does not apply."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    for node in out.node:
        node.device = ""
    return out


def split_replicated(model, method: str, dataset: tf.data.Dataset, strategy, *, autograph: bool,
                     deterministic: bool = True) -> SplitStep:
    """The model's `method` under `strategy`, split: `.dataset` is `dataset` cut into per-replica slices and
    mapped by the prefetch side (hand it to Keras with `distributing`), `.step` the ReplicaStep Keras calls
    per replica (trace it under `substituting`). NothingToMoveError when no op of a replica moves.

        before:  model.fit(ds)                                  # under strategy.scope()
        after:   s = split_replicated(model, "train_step", ds, strategy, autograph=False)
                 with substituting(), distributing(strategy, {id(ds): s.dataset}): model.fit(ds)  # train_step = s.step
    """
    per_replica = per_replica_dataset(strategy, dataset)
    spec = per_replica.element_spec
    flat = tf.nest.flatten(spec, expand_composites=True)
    with strategy.scope():
        traced, received = trace_replicated(model, method, spec, strategy, autograph)
    analysis = analyse(traced, static_tables([model]), read_only=False)
    view, moved, boundary = _replica_zero(traced, analysis, received, len(flat))
    if not moved:
        why = analysis.why_not or "no op of a replica's step depends on its slice of the batch alone"
        raise NothingToMoveError(f"fit(): nothing in {model.name}.{method} can move under {type(strategy).__name__} "
                                 f"({why})", reason=why)
    inputs = traced.inputs[:len(flat)]
    graph = traced.concrete.graph
    shapes = {t: graph.get_tensor_by_name(t).shape.as_proto() for t in boundary}
    sides = cut(traced.graph_def, moved, inputs, boundary, shapes)
    sides = dataclasses.replace(sides, prefetch_graph_def=_without_devices(sides.prefetch_graph_def))
    zero = dataclasses.replace(traced, inputs=inputs)
    prefetch = prefetch_function(sides, zero)

    got = {t: k for k, t in enumerate(received[0])}
    # The placeholder of a replica-0 input stands for the same value as the tensor the step received.
    got.update({f"{name}:0": k for k, name in enumerate(inputs)})
    captured = {c.placeholder: capture_key(c.external) for c in traced.captures}
    keys = reference_keys(view, got, captured, set(moved) | {parse_tensor_name(t).node for t in boundary})
    boundary_keys = {}
    passed = {}
    for index, tensor in enumerate(boundary):
        t = parse_tensor_name(tensor)
        if str(t) in got:
            passed[got[str(t)]] = index
        elif keys.get(t.node) is not None:
            boundary_keys[(keys[t.node], t.port)] = index
        else:
            raise SplitError(f"fit(): {model.name}.{method}: the boundary tensor {tensor!r} has no structural key "
                             f"(it reads an unmatched input); train this model with model.fit under the strategy")
    plan = ReplicaPlan(moved_keys=frozenset(keys[n] for n in moved if keys.get(n) is not None),
                       boundary=boundary_keys, passed=passed, input_specs=tuple(flat), structure=spec,
                       element_specs=tuple(element_specs(sides, zero, prefetch.packing)))
    logger.info("%s.%s under %s: %d op(s) of each replica moved, %d boundary tensor(s)", model.name, method,
                type(strategy).__name__, len(moved), len(boundary))
    return SplitStep(dataset=mapped_dataset(per_replica, prefetch, deterministic=deterministic),
                     step=ReplicaStep(model, method, plan, prefetch.packing), traced=zero, analysis=analysis,
                     sides=sides, deterministic=deterministic, prefetch_function=prefetch)


# ---------------------------------------------------------------------------------------------- the main side

def _filler(tensor) -> tf.Tensor:
    """A stand-in of `tensor`'s static shape and dtype that holds nothing (unknown dimensions are 0)."""
    shape = tensor.shape
    dims = [0 if d is None else d for d in shape.as_list()] if shape.rank is not None else [0]
    default = tf.zeros(dims, tensor.dtype) if tensor.dtype != tf.string else tf.fill(dims, "")
    return tf.compat.v1.placeholder_with_default(default, shape=shape)


class _Substitution:
    """An op callback, for one replica's trace of the step: keys each new op by structure and hands the
    consumers of a boundary tensor the replica's prefetched value instead. Keys are computed from the graph
    itself (an op the callback did not see is keyed when a consumer asks), so they never depend on which
    ops a callback was shown."""

    def __init__(self, plan: ReplicaPlan, values: list, keyed: dict):
        self.plan, self.values = plan, values
        self.keyed = keyed  # {tensor ref: key}: this replica's stand-ins, then every tensor keyed so far
        self.substituted: set[int] = set()
        self.thread = threading.get_ident()  # the replica's tracing thread

    def _own_key(self, tensor, inputs: tuple) -> Key:
        op = tensor.op
        if op.type == "Placeholder":
            external = _external(tensor)
            return None if external is None else (capture_key(external), 0)  # as the reference keys captures
        if any(k is None for k in inputs):
            return None
        return (_op_key(op.node_def, inputs), tensor.value_index)

    def key(self, tensor) -> Key:
        """The tensor's structural key (None when it reads something the reference cannot name)."""
        stack = [tensor]
        while stack:
            top = stack[-1]
            if top.ref() in self.keyed:
                stack.pop()
                continue
            pending = [] if top.op.type in ("Placeholder", "Const") else [
                t for t in top.op.inputs if t.ref() not in self.keyed]
            if pending:
                stack.extend(pending)
                continue
            inputs = () if top.op.type in ("Placeholder", "Const") else tuple(
                self.keyed[t.ref()] for t in top.op.inputs)
            self.keyed[top.ref()] = self._own_key(top, inputs)
            stack.pop()
        return self.keyed[tensor.ref()]

    def op_key(self, op) -> Key:
        """The op's key, as reference_keys gives its node."""
        inputs = tuple(self.key(t) for t in op.inputs)
        return None if any(k is None for k in inputs) else _op_key(op.node_def, inputs)

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if not outputs or not hasattr(outputs[0], "op") \
                or outputs[0].op.type == "Placeholder":
            return None
        replaced, changed = list(outputs), False
        for port, tensor in enumerate(outputs):
            index = self.plan.boundary.get(self.key(tensor))
            if index is not None:
                replaced[port] = self.values[index]
                self.keyed[replaced[port].ref()] = self.keyed[tensor.ref()]
                self.substituted.add(index)
                changed = True
        return replaced if changed else None


# The substitution of the replica tracing in each thread. MirroredStrategy traces each replica in a thread of
# its own that shares the op callbacks of the thread that called strategy.run: one dispatcher, installed in
# that thread (`substituting`), hands each op to its replica's substitution.
_ACTIVE: dict[int, _Substitution] = {}


def _dispatch(op_type, inputs, attrs, outputs, op_name=None, graph=None):
    substitution = _ACTIVE.get(threading.get_ident())
    return None if substitution is None else substitution(op_type, inputs, attrs, outputs, op_name, graph)


@contextlib.contextmanager
def substituting():
    """For the duration, replica steps traced from this thread (Keras's train function) substitute the
    prefetched values; install it around the model.fit call that traces a ReplicaStep.

        before:  model.fit(distributed_dataset)
        after:   with substituting(): model.fit(distributed_dataset)
    """
    from tensorflow.python.framework import op_callbacks

    op_callbacks.add_op_callback(_dispatch)
    try:
        yield
    finally:
        op_callbacks.remove_op_callback(_dispatch)


@contextlib.contextmanager
def _active(substitution: _Substitution):
    from tensorflow.python.eager import context

    if _dispatch not in context.context().op_callbacks:
        raise SplitError("fit(): a step split for a distribution strategy was traced outside ss.tf2.fit (its "
                         "replicas would read stand-ins); train the model with ss.tf2.fit or model.fit")
    _ACTIVE[substitution.thread] = substitution
    try:
        yield
    finally:
        _ACTIVE.pop(substitution.thread, None)


def _check_and_quiet(stand_ins: list, substitution: _Substitution, plan: ReplicaPlan, where: str) -> None:
    """Every op that reads this replica's stand-ins (directly or through other such ops) must be a moved op of
    the reference, whose values nothing else reads; stateful ones get empty inputs (a function runs every
    stateful op). Followed along the graph's edges, not by creation order: replicas trace interleaved."""
    reached = {t.ref() for t in stand_ins}
    frontier = list(stand_ins)
    seen_ops = set()
    while frontier:
        tensor = frontier.pop()
        for op in tensor.consumers():
            if op in seen_ops:
                continue
            seen_ops.add(op)
            if substitution.op_key(op) not in plan.moved_keys:
                raise SplitError(f"fit(): {where}: op {op.name!r} ({op.type}) of a replica's step reads the raw "
                                 "batch but is not one the split moved (the step traces differently per replica); "
                                 "train this model with model.fit under the strategy")
            for out in op.outputs:
                if out.ref() not in reached:
                    reached.add(out.ref())
                    frontier.append(out)
    # Re-pointed only once every op is checked: a key is read from the op's inputs as they are now.
    for op in seen_ops:
        if op._is_stateful:  # noqa: SLF001 - a stateful op runs whether or not its value is read
            for port, inp in enumerate(op.inputs):
                if inp.dtype != tf.resource:
                    op._update_input(port, _filler(inp))  # noqa: SLF001


class ReplicaStep:
    """The main side under a strategy: Keras calls it as the model's step, once per replica, with that
    replica's boundary; it runs the model's own step with the prefetched values in place of the moved ops."""

    def __init__(self, model, method: str, plan: ReplicaPlan, packing: Packing):
        self._model = weakref.ref(model)
        self._impl = getattr(type(model), method)
        self.method, self.plan, self.packing = method, plan, packing
        self.refused: SplitError | None = None  # why a replica's trace was refused (Keras rewraps the error)
        self.__name__ = f"{type(model).__name__}_{method}_replica"

    def __call__(self, element):
        model, plan = self._model(), self.plan
        flat_element = tf.nest.flatten(element)
        for tensor, spec in zip(flat_element, plan.element_specs):
            # A dataset handed out replica by replica reads its elements through an optional, which drops
            # their static shapes; the step is traced with them, as model.fit traces it.
            tensor.set_shape(spec.shape)
        values = unpack(flat_element, self.packing)
        keyed, stand_ins, flat = {}, [], []
        for k, spec in enumerate(plan.input_specs):
            if k in plan.passed:
                tensor = values[plan.passed[k]]
            else:
                tensor = _filler(tf.TensorSpec(spec.shape, spec.dtype))
                stand_ins.append(tensor)
            keyed[tensor.ref()] = ("in", k)
            flat.append(tensor)
        data = tf.nest.pack_sequence_as(plan.structure, flat, expand_composites=True)
        substitution = _Substitution(plan, values, keyed)
        with _active(substitution):
            outputs = self._impl(model, data)
        try:
            _check_and_quiet(stand_ins, substitution, plan, f"{model.name}.{self.method}")
        except SplitError as e:
            self.refused = e
            raise
        return outputs


__all__ = ["ReplicaPlan", "ReplicaStep", "distributing", "substituting", "per_replica_dataset", "split_replicated"]
