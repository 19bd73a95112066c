"""Which Keras layer calls move, decided by the op-level partition of each call: IntegerLookup, HashedCrossing
and reshapes move; Dense, BatchNormalization (trained) and a Dropout reading them stay; a Dropout before
anything trained stays because its op reads the SeedGenerator's state; Sequential models split too.

    before:  Input -> IntegerLookup / HashedCrossing -> Concatenate -> Dense -> BatchNorm -> Dropout -> Dense
    after:   dataset.map(IntegerLookup / HashedCrossing -> Concatenate);  Dense -> BatchNorm -> Dropout -> Dense
"""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import smartstage.tf2 as sst
from smartstage.errors import SplitError

pytestmark = pytest.mark.usefixtures("eager")


def _dataset():
    rng = np.random.default_rng(0)
    x = {"a": rng.integers(0, 5, (32, 1)), "b": rng.choice(["x", "y"], (32, 1)),
         "c": rng.normal(size=(32, 3)).astype("float32")}
    return tf.data.Dataset.from_tensor_slices((x, rng.normal(size=(32, 1)).astype("float32"))).batch(8)


def _model():
    keras.utils.set_random_seed(1)
    a = keras.Input((1,), dtype="int64", name="a")
    b = keras.Input((1,), dtype="string", name="b")
    c = keras.Input((3,), name="c")
    ids = keras.layers.IntegerLookup(vocabulary=[0, 1, 2], output_mode="one_hot", name="ids")(a)
    cross = keras.layers.HashedCrossing(num_bins=5, output_mode="one_hot", name="cross")(
        (keras.layers.Reshape((), name="flat_a")(a), keras.layers.Reshape((), name="flat_b")(b)))
    h = keras.layers.Dense(4, name="hidden")(keras.layers.Concatenate(name="concat")([ids, cross, c]))
    h = keras.layers.Dropout(0.3, name="drop")(keras.layers.BatchNormalization(name="norm")(h))
    model = keras.Model({"a": a, "b": b, "c": c}, keras.layers.Dense(1, name="score")(h))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def test_lookups_and_crosses_move_and_the_trained_part_keeps_every_value():
    reference = _model()
    expected = reference.fit(_dataset(), epochs=3, verbose=0).history["loss"]
    model = _model()
    history = sst.fit(model, _dataset(), epochs=3, verbose=0)
    assert history.history["loss"] == expected
    for a, b in zip(reference.get_weights(), model.get_weights()):  # BatchNorm's moving statistics too
        np.testing.assert_array_equal(a, b)
    split = history.smartstage
    assert set(split.moved_layers) == {"ids", "cross", "flat_a", "flat_b", "concat"}
    kept = {v.layer: v.reason for v in split.verdicts if not v.moved}
    assert kept["drop"] == "it reads a layer that stays in the model"
    assert "trainable weights" in kept["norm"]


def test_a_dropout_on_raw_inputs_stays_for_its_random_state():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dropout(0.5, name="drop")(inputs)))
    with pytest.raises(SplitError, match=r"layer 'drop': its op .* reads variable 'captured/seed_generator"):
        sst.split_model(model)


def test_explain_a_layer_call():
    inputs = {"x": keras.Input((3,), name="x"), "s": keras.Input((1,), dtype="string", name="s")}
    dropped = keras.layers.Dropout(0.5, name="drop")(inputs["x"])
    looked_up = keras.layers.StringLookup(vocabulary=["a"], output_mode="one_hot", name="lookup")(inputs["s"])
    output = keras.layers.Dense(1, name="score")(keras.layers.Concatenate(name="cat")([dropped, looked_up]))
    split = sst.split_model(keras.Model(inputs, output))
    assert split.explain("lookup").startswith("layer 'lookup' (StringLookup) moved to the dataset")
    why = split.explain("drop")
    assert "stays in the model" in why
    assert re.search(r"chain: captured/seed_generator\w*/seed_generator_state -> ", why)  # numbered per session
    with pytest.raises(SplitError, match="no layer call 'lookups'; did you mean 'lookup'"):
        split.explain("lookups")


def test_a_sequential_model():
    model = keras.Sequential([keras.Input((1,), dtype="string"),
                              keras.layers.StringLookup(vocabulary=["x"], output_mode="one_hot", name="lookup"),
                              keras.layers.Dense(1, name="score")])
    split = sst.split_model(model)
    assert split.moved_layers == ("lookup",)
    assert split.trainer.get_layer("score") is model.get_layer("score")


class _Print(keras.layers.Layer):
    def call(self, x):
        tf.print(x)  # an effect: on the prefetch side it would print batches ahead of the step, out of order
        return x * 2.0


class _Python(keras.layers.Layer):
    def call(self, x):
        out = tf.numpy_function(lambda v: v + 1.0, [x], tf.float32, stateful=False)
        out.set_shape(x.shape)
        return out


@pytest.mark.parametrize("layer, reason", [(_Print, r"PrintV2"), (_Python, r"runs Python \(PyFuncStateless")])
def test_a_layer_that_prints_or_runs_python_stays_in_the_model(layer, reason):
    #   c -> effect layer (reads raw input only, no weights) -> Dense -> loss
    keras.utils.set_random_seed(1)
    c = keras.Input((3,), name="c")
    kept = layer(name="effect")(c)
    moved = keras.layers.Reshape((3,), name="flat")(c)
    model = keras.Model({"c": c}, keras.layers.Dense(1, name="out")(keras.layers.Concatenate()([kept, moved])))
    halves = sst.split_model(model)
    verdict = next(v for v in halves.verdicts if v.layer == "effect")
    assert not verdict.moved and re.search(reason, verdict.reason), verdict.reason
    assert "flat" in halves.moved_layers  # the rest of the model still splits
