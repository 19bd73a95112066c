"""replica_step: the main side of a step split under a strategy, which Keras traces once per replica.

    before:  model.train_step(raw slice)         # Keras, in each replica: preprocessing, loss, all-reduce, update
    after:   ReplicaStep(model, ...)(boundary)   # the model's own step, its moved ops' values prefetched

Under a strategy the step's own code all-reduces the gradients, scales the loss by the number of replicas and
updates mirrored variables, so the main side is the model's step as Keras traces it in each replica, not a
graph imported once. ReplicaStep runs it on stand-ins of the raw slice (empty tensors of its spec), and
while it traces, an op callback hands every op whose key (smartstage.tf2.strategy.replica_keys) is a boundary key of
the plan the prefetched value in its place. Afterwards every op that still reads a stand-in must be a moved
op of the reference, whose value nothing else reads; else SplitError: the stand-ins never reach what the
step computes or returns. Stateful ops among them (a table lookup) would still run; their inputs are
re-pointed at empty stand-ins, so they run on nothing and the dead ops above them are pruned.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from smartstage.errors import SplitError
from smartstage.tf2.step.functions import Packing, unpack
from smartstage.tf2.strategy.replica_keys import LiveKeys, input_key


@dataclass(frozen=True)
class ReplicaPlan:
    """What the main side needs to recognise the moved ops in each replica's trace of the step."""

    moved_keys: frozenset  # keys of replica 0's moved ops
    boundary: dict  # {tensor key: boundary index}
    passed: dict  # {flat input index: boundary index} for inputs that cross as they are
    input_specs: tuple  # the flat spec of one replica's raw slice
    structure: Any  # its nest structure (element_spec)
    element_specs: tuple = ()  # the specs of one mapped element (the boundary, packed)


def _filler(tensor) -> tf.Tensor:
    """A stand-in of `tensor`'s static shape and dtype that holds nothing (unknown dimensions are 0)."""
    shape = tensor.shape
    dims = [0 if d is None else d for d in shape.as_list()] if shape.rank is not None else [0]
    default = tf.zeros(dims, tensor.dtype) if tensor.dtype != tf.string else tf.fill(dims, "")
    return tf.compat.v1.placeholder_with_default(default, shape=shape)


class _Substitution(LiveKeys):
    """An op callback, for one replica's trace of the step: hands the consumers of a boundary tensor (an op
    output whose key is a boundary key of the plan) the replica's prefetched value instead."""

    def __init__(self, plan: ReplicaPlan, values: list, keyed: dict):
        super().__init__(keyed)
        self.plan, self.values = plan, values
        self.thread = threading.get_ident()  # the replica's tracing thread

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if not outputs or not hasattr(outputs[0], "op") or outputs[0].op.type == "Placeholder":
            return None
        replaced, changed = list(outputs), False
        for port, tensor in enumerate(outputs):
            index = self.plan.boundary.get(self.key(tensor))
            if index is not None:
                replaced[port] = self.values[index]
                self.keyed[replaced[port].ref()] = self.keyed[tensor.ref()]
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
            keyed[tensor.ref()] = input_key(k)
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


__all__ = ["ReplicaPlan", "ReplicaStep", "substituting"]
