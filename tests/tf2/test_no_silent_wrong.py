"""What must never give a silently wrong split: a cut across a colocation, a stateful op on the prefetch side,
a check that compares different batches, a missing key or an XLA step that fails only when it first runs.

    before:  ss.tf2.split(tf.function(model.train_step), ds)   # ValueError from import_graph_def
    after:   the split runs; or SplitError naming the node or key and the fix, before anything is built
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import smartstage.tf2 as sst
from smartstage.errors import SplitError
from smartstage.passes.cut_cost import CHEAP_OPS
from tests.tf2.steps import dlrm_program, raw_dataset

pytestmark = pytest.mark.usefixtures("eager")


class BagModel(keras.Model):
    """ids -> Embedding(10, 4) -> sum -> Dense(1): the gradient's Shape op is colocated with the table's read."""

    def __init__(self):
        super().__init__()
        self.embedding = keras.layers.Embedding(10, 4)
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(keras.ops.sum(self.embedding(x["ids"]), 1))


def _bag_split():
    """A compiled BagModel built by one fit step, its dataset of 2 batches, and its train step split."""
    keras.utils.set_random_seed(3)
    model = BagModel()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rng = np.random.default_rng(0)
    ds = tf.data.Dataset.from_tensor_slices(({"ids": rng.integers(0, 10, (16, 3))},
                                             rng.uniform(size=(16, 1)).astype("float32"))).batch(8)
    model.fit(ds.take(1), verbose=0)  # builds the model and the optimizer
    return model, ds, sst.split(tf.function(model.train_step), ds)


def test_a_moved_op_colocated_with_a_variable_read_splits_and_trains():
    _, _, split = _bag_split()
    colocated = [n.name for n in split.sides.prefetch_graph_def.node if "_class" in n.attr]
    names = {n.name for n in split.sides.prefetch_graph_def.node}
    for node in split.sides.prefetch_graph_def.node:  # no tag names a node the side does not have
        for tag in node.attr["_class"].list.s if "_class" in node.attr else ():
            assert tag[5:].decode() in names, (node.name, tag, colocated)
    losses = [float(split.step(b)["loss"]) for b in split.dataset]
    assert len(losses) == 2 and all(np.isfinite(losses))


def _python_and_state_step():
    w = tf.Variable(tf.ones([4, 1]))

    @tf.function
    def step(ids):
        a = tf.numpy_function(lambda v: v % 4, [ids], tf.int64, stateful=False)  # PyFuncStateless
        b = tf.py_function(lambda v: v % 4, [ids], tf.int64)                     # EagerPyFunc
        tf.print(ids)                                                             # PrintV2
        noise = tf.random.uniform(tf.shape(ids), seed=1)                          # RandomUniform
        kept = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 4)       # may move
        return tf.reduce_sum(tf.gather(w, a) + tf.gather(w, b) + tf.gather(w, kept)) + tf.reduce_sum(noise)

    return step


def test_python_prints_and_random_ops_never_move():
    ds = tf.data.Dataset.from_tensor_slices(np.array([1, 2, 3, 1], np.int64)).batch(2)
    split = sst.split(_python_and_state_step(), ds)
    ops = {n.name: n.op for n in split.analysis.graph_def.node}
    for op in ("PyFuncStateless", "EagerPyFunc", "PrintV2", "RandomUniform"):
        name = next(n for n, o in ops.items() if o == op)
        assert name not in split.moved, op
        assert split.pinned[name].kind in ("stateful", "variable"), (op, split.pinned[name])
    assert "StringToHashBucketFast" in split.moved  # the rest of the step still splits


def test_verify_compares_the_same_batches_of_a_shuffled_dataset():
    program = dlrm_program()
    check = sst.verify(program.step, raw_dataset().shuffle(60, reshuffle_each_iteration=False), steps=6)
    assert check.identical, check.describe()  # before: "step 0: loss differs" (two passes, two orders)


def test_verify_refuses_a_dataset_that_reshuffles_each_iteration():
    """Reading batches to compare would advance the shuffle's seed, and training would then see another order."""
    program = dlrm_program()
    with pytest.raises(SplitError, match=r"verify\(\): the dataset reshuffles each iteration.*second dataset"):
        sst.verify(program.step, raw_dataset().shuffle(60), steps=6)


def test_a_key_the_dataset_lacks():
    @tf.function
    def step(batch):
        return tf.reduce_sum(tf.strings.to_hash_bucket_fast(batch["city"], 4))

    ds = tf.data.Dataset.from_tensor_slices({"town": ["a", "b"], "age": [1.0, 2.0]}).batch(2)
    with pytest.raises(SplitError, match=r"reads key 'city' that the dataset's elements do not have "
                                         r"\(their keys: 'town', 'age'\)"):
        sst.split(step, ds)


def test_jit_compile_step_with_a_table_is_refused_and_the_fix_works():
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant([1, 2], tf.int64), tf.constant([0, 1], tf.int64)), 2)
    w = tf.Variable([[1.0], [2.0], [3.0]])

    def body(ids):
        return tf.reduce_sum(tf.gather(w, table.lookup(ids)))

    ds = tf.data.Dataset.from_tensor_slices(np.array([1, 2, 3, 1], np.int64)).batch(2)
    with pytest.raises(SplitError, match=r"jit_compile=True and table lookups XLA cannot compile "
                                         r"\('None_Lookup/LookupTableFindV2'\).*pass jit_compile=True to split\(\)"):
        sst.split(tf.function(body, jit_compile=True), ds)
    split = sst.split(tf.function(body), ds, jit_compile=True)  # the fix the message gives: main side compiled
    assert [float(split.step(b)) for b in split.dataset] == [3.0, 4.0]


def test_a_dense_step_with_nothing_worth_moving_is_refused_and_says_why():
    w = tf.Variable(tf.ones([3, 1]))
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):  # the batch alone feeds only the gradient's shapes: nothing worth a map
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)[:, 0] - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return loss

    ds = tf.data.Dataset.from_tensor_slices((np.ones((16, 3), np.float32), np.ones(16, np.float32))).batch(4)
    with pytest.raises(SplitError, match=r"nothing in 'step' can move .*nothing worth moving: the moved part is "
                                         r"shape arithmetic only \(Shape\)"):
        sst.split(step, ds)


def test_the_keras_gradient_shapes_are_recomputed_in_the_step():
    model, ds, split = _bag_split()
    assert split.analysis.worth_moving and split.analysis.why_not == ""
    recomputed = split.analysis.partition.recomputed
    assert recomputed and all(split.pinned[n].kind == "recompute" for n in recomputed)
    ops = {n.name: n.op for n in split.analysis.graph_def.node}
    assert {ops[n] for n in recomputed} <= CHEAP_OPS
    crossing_shapes = [t for t in split.boundary if ops[t.split(":")[0]] in ("Shape", "Size", "ExpandDims")]
    assert not crossing_shapes  # every shape of a tensor that crosses anyway is recomputed
    check = sst.verify(tf.function(model.train_step), ds, steps=2, split=split)
    assert check.identical, check.describe()


def test_verify_fit_compares_the_same_batches_of_a_shuffled_dataset():
    from tests.tf2.keras_models import preprocessing_model, raw_dataset as keras_dataset

    check = sst.verify_fit(preprocessing_model(), keras_dataset().shuffle(64, reshuffle_each_iteration=False),
                           steps=4)
    assert check.identical, check.describe()
