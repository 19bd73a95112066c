"""Bad input to smartstage.tf2 gets a SplitError naming the cause and the fix, before anything is built:
the user's step, model and dataset are as they were.

    before:  ss.tf2.split(python_step, ds)   # a plain function: its side effects would run once, silently
    after:   SplitError: split(): 'python_step' is a plain Python callable ..., decorate ... with @tf.function
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import smartstage.tf2 as sst
from smartstage.errors import SmartStageError, SplitError
from tests.tf2.keras_models import preprocessing_model, raw_dataset as keras_dataset
from tests.tf2.steps import dlrm_program, raw_dataset

pytestmark = pytest.mark.usefixtures("eager")


def _strings():
    return tf.data.Dataset.from_tensor_slices((["a", "bb", "ccc", "dddd"], [1.0, 2.0, 3.0, 4.0])).batch(2)


def test_a_plain_python_step():
    def python_step(batch):
        return batch

    with pytest.raises(SplitError, match=r"'python_step' is a plain Python callable .*@tf\.function"):
        sst.split(python_step, raw_dataset())


def test_nothing_to_move():
    w = tf.Variable(2.0)

    @tf.function
    def step(x):  # every op reads the variable: nothing depends on the batch alone
        return tf.reduce_sum(x * w)

    ds = tf.data.Dataset.from_tensor_slices(np.ones((4, 3), np.float32)).batch(2)
    with pytest.raises(SplitError, match=r"nothing in 'step' can move .*prefetch\(tf\.data\.AUTOTUNE\)"):
        sst.split(step, ds)


def test_element_spec_that_does_not_fit_the_signature():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(ids):
        return tf.reduce_sum(ids)

    with pytest.raises(SplitError, match=r"element_spec .* does not fit the signature of 'step' .*input_signature"):
        sst.split(step, raw_dataset())


def test_a_step_that_reads_python_state():
    calls = []

    @tf.function
    def step(x, y):
        calls.append(1)  # a Python counter: its value is frozen into the graph at each trace
        return tf.reduce_sum(tf.strings.length(x)) + len(calls)

    with pytest.raises(SplitError, match=r"different graph each time.*Python state.*tf\.Variable"):
        sst.split(step, _strings())


def test_jit_compile_with_string_ops():
    @tf.function(jit_compile=True)
    def step(x, y):
        return tf.reduce_sum(tf.cast(tf.strings.length(x), tf.float32) * y)

    with pytest.raises(SplitError, match=r"jit_compile=True and string ops XLA cannot compile .*"
                                         r"pass jit_compile=True to split\(\)"):
        sst.split(step, _strings())


def test_not_a_dataset():
    with pytest.raises(SplitError, match="not a tf.data.Dataset"):
        sst.split(dlrm_program().step, [1, 2, 3])


def test_a_model_that_is_not_compiled():
    model = keras.Model.from_config(preprocessing_model().get_config())
    with pytest.raises(SplitError, match=r"not compiled; call model\.compile"):
        sst.fit(model, keras_dataset(), epochs=1, verbose=0)


def _dense_only(subclassed: bool):
    keras.utils.set_random_seed(3)
    if subclassed:
        class DenseOnly(keras.Model):
            def __init__(self):
                super().__init__()
                self.hidden, self.out = keras.layers.Dense(2), keras.layers.Dense(1)

            def call(self, x):
                return self.out(self.hidden(x))

        model = DenseOnly()
        model(np.ones((1, 3), "float32"))
    else:
        inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(2)(inputs)))
    model.compile("sgd", "mse")
    return model


@pytest.mark.parametrize("subclassed", [False, True], ids=["layers", "steps"])
def test_a_keras_model_with_nothing_to_move_trains_as_model_fit(subclassed, caplog):
    rows = np.arange(12, dtype="float32").reshape(4, 3) / 10
    ds = tf.data.Dataset.from_tensor_slices((rows, np.ones((4, 1), "float32"))).batch(2)
    reference, model = _dense_only(subclassed), _dense_only(subclassed)
    expected = reference.fit(ds, epochs=2, verbose=0)
    with caplog.at_level(logging.WARNING, logger="smartstage.tf2.keras.fit"):
        history = sst.fit(model, ds, epochs=2, verbose=0)
    assert history.history == expected.history
    assert all(np.array_equal(a, b) for a, b in zip(reference.get_weights(), model.get_weights()))
    assert type(history.smartstage).__name__ == "NotSplit"
    assert "not split" in caplog.text and history.smartstage.reason in caplog.text
    assert "model.fit" in history.smartstage.summary()


def test_arrays_instead_of_a_dataset():
    with pytest.raises(SplitError, match=r"validation_data is a tuple; pass a batched tf\.data\.Dataset"):
        sst.fit(preprocessing_model(), keras_dataset(), validation_data=(np.ones(3), np.ones(3)), epochs=1)


def test_split_errors_are_smartstage_errors():
    assert issubclass(SplitError, SmartStageError) and issubclass(SplitError, ValueError)
