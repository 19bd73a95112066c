"""The pieces of the step route under a strategy that need no devices (smartstage.tf2.strategy.replica_keys,
replica_step): structural keys that agree between a GraphDef and a live trace, the check that no op reads the
raw stand-ins unless it moved, and the search for a model's tables past the strategy it holds. The route itself,
against model.fit under a 2-replica MirroredStrategy: test_fit_strategy_steps.py.

    reference GraphDef:  x -> StringToHashBucketFast(8) -> lookup(table) -> y     keys: K(hash), K(lookup)
    a second trace:      x' -> StringToHashBucketFast(8) -> lookup(table) -> y'   the same keys, node for node
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.errors import SplitError
from smartstage.graph.view import GraphView
from smartstage.tf2.step.state import static_tables
from smartstage.tf2.strategy import replica_keys, replica_step

pytestmark = pytest.mark.usefixtures("eager")


def _table():
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(tf.constant([0, 1, 2], tf.int64),
                                                                         tf.constant([10, 11, 12], tf.int64)), -1)


def _traced(buckets: int, table, scale):
    #   x(string) -> StringToHashBucketFast(buckets) -> Mod(3) -> lookup(table) -> Cast -> Mul(scale) -> y
    @tf.function
    def step(x):
        ids = tf.math.floormod(tf.strings.to_hash_bucket_fast(x, buckets), 3)
        return tf.cast(table.lookup(ids), tf.float32) * scale

    return step.get_concrete_function(tf.TensorSpec([None], tf.string))


def _live_keys(concrete) -> dict[str, object]:
    """{op name: key} of a trace, keyed as the main side keys a replica's ops (its input is input 0)."""
    graph = concrete.graph
    keys = replica_keys.LiveKeys({graph.inputs[0].ref(): replica_keys.input_key(0)})
    return {op.name: keys.op_key(op) for op in graph.get_operations() if op.type != "Placeholder"}


def _reference_keys(concrete) -> dict[str, object]:
    graph_def = concrete.graph.as_graph_def()
    view = GraphView(graph_def)
    graph = concrete.graph
    captures = {t.op.name: replica_keys.capture_key(external) for external, t in graph.captures}
    keys = replica_keys.reference_keys(view, {f"{graph.inputs[0].op.name}:0": 0}, captures,
                                   {n.name for n in graph_def.node})
    return {name: key for name, key in keys.items() if view.op(name) != "Placeholder"}


def test_a_graph_def_and_a_second_trace_key_every_op_alike():
    table, scale = _table(), tf.constant(2.0)
    reference, live = _reference_keys(_traced(8, table, scale)), _live_keys(_traced(8, table, scale))
    computed = {name for name in live if name not in ("Identity", "NoOp")}
    assert computed and all(reference[name] == live[name] and live[name] is not None for name in computed)
    # What decides the value decides the key: another bucket count, another table, another captured value.
    for other in (_traced(16, table, scale), _traced(8, _table(), scale), _traced(8, table, tf.constant(3.0))):
        changed = _live_keys(other)
        assert any(changed[name] != live[name] for name in computed)


def test_an_op_reading_the_stand_ins_that_did_not_move_is_refused():
    #   stand-in -> StringToHashBucketFast (moved) -> AddV2 (not moved: the check names it)
    plan = None

    @tf.function(autograph=False)
    def step(x):
        nonlocal plan
        stand_in = replica_step._filler(tf.TensorSpec([None], tf.string))
        substitution = replica_step._Substitution(replica_step.ReplicaPlan(frozenset(), {}, {}, (), None), [],
                                              {stand_in.ref(): replica_keys.input_key(0)})
        hashed = tf.strings.to_hash_bucket_fast(stand_in, 8)
        plan = replica_step.ReplicaPlan(frozenset({substitution.op_key(hashed.op)}), {}, {}, (), None)
        tf.math.add(hashed, 1, name="not_moved")
        replica_step._check_and_quiet([stand_in], substitution, plan, "model.train_step")
        return x

    with pytest.raises(SplitError, match=r"op 'not_moved' \(AddV2\) of a replica's step reads the raw batch"):
        step.get_concrete_function(tf.TensorSpec([], tf.float32))


def test_a_replica_step_traced_outside_fit_is_refused():
    substitution = replica_step._Substitution(replica_step.ReplicaPlan(frozenset(), {}, {}, (), None), [], {})
    with pytest.raises(SplitError, match="traced outside ss.tf2.fit"):
        with replica_step._active(substitution):
            pass
    with replica_step.substituting(), replica_step._active(substitution):
        pass  # under fit's context it is allowed


class _Leaf:
    def __init__(self):
        self.value = None


class _Holder:
    """Layers first, then more objects than the search visits (as a strategy's object graph is)."""

    def __init__(self, table):
        self.layers = [{"table": table}]
        self.noise = [[_Leaf() for _ in range(10_000)] for _ in range(6)]


def test_static_tables_finds_a_table_near_the_root_past_a_large_object_graph():
    table = _table()
    found = static_tables([_Holder(table)])
    assert found == {id(table.resource_handle): table}
    assert static_tables([tf.distribute.get_strategy()]) == {}  # a strategy holds no table of the step
