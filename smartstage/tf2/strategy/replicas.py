"""replicas: a Keras model's own train (or test) step split under tf.distribute.MirroredStrategy.

    before:  with strategy.scope(): model = Ranker();   model.fit(ds)        # each replica preprocesses its slice
    after:   with strategy.scope(): model = Ranker();   ss.tf2.fit(model, ds)  # the distributed dataset does it

1. Reference: the step traced for all replicas at once (`strategy.run` in one tf.function, each replica fed
   its own slice of the batch), partitioned by the engine of ss.tf2.split with every variable pinned.
   Replica 0's moved ops, cut out, are the prefetch side: one replica's raw slice in, its boundary out.
2. Dataset: the raw batches cut into per-replica slices as `experimental_distribute_dataset` cuts them,
   mapped by the prefetch side, and handed to Keras in place of its own distribution of the raw dataset
   (`distributing`), so replica r gets the boundary of the slice it would have got.
3. Main side: the model's own step, traced by Keras per replica with the prefetched values in place of the
   moved ops (smartstage.tf2.strategy.replica_step), matched to the reference by structure, never by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref

import tensorflow as tf

from smartstage.errors import NothingToMoveError, SplitError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.tf2.step.analysis import Analysis, analyse
from smartstage.tf2.step.attributes import overridden
from smartstage.tf2.step.functions import element_specs, mapped_dataset, prefetch_function
from smartstage.tf2.step.split import SplitStep
from smartstage.tf2.step.state import static_tables
from smartstage.graph.rewrites import cut
from smartstage.tf2.step.trace import TracedStep, trace_step
from smartstage.tf2.strategy.replica_keys import capture_key, reference_keys, tensor_key
from smartstage.tf2.strategy.replica_step import ReplicaPlan, ReplicaStep, substituting

logger = logging.getLogger(__name__)


def _slice_rows(tensor, replicas: int) -> int | None:
    """The static row count of every slice of `tensor`: known when its batch is (drop_remainder=True) and
    splits evenly, as tf.distribute's per-replica element spec then has it."""
    rows = tensor.shape[0] if tensor.shape.rank else None
    return rows // replicas if rows is not None and rows % replicas == 0 else None


def _with_rows(tensor, rows: int | None):
    if rows is None or isinstance(tensor, tf.RaggedTensor):
        return tensor
    return tf.ensure_shape(tensor, [rows] + tensor.shape.as_list()[1:])


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
            return tf.nest.map_structure(lambda t: _with_rows(t[start:stop], _slice_rows(t, replicas)), element)

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
    original = strategy.experimental_distribute_dataset

    def experimental_distribute_dataset(dataset, options=None):
        mapped = replaced.get(id(dataset))
        if mapped is None:
            return original(dataset, options)
        return strategy.distribute_datasets_from_function(lambda context: mapped, options)

    with overridden(strategy, experimental_distribute_dataset=experimental_distribute_dataset):
        yield


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
            boundary_keys[tensor_key(keys[t.node], t.port)] = index
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


__all__ = ["distributing", "per_replica_dataset", "split_replicated", "substituting"]
