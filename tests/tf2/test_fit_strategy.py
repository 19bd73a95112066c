"""ss.tf2.fit under tf.distribute.MirroredStrategy (two logical CPU devices): the preprocessing layers run in the
dataset that Keras distributes, and losses, weights and evaluation equal model.fit under the same strategy
(the step route under a strategy: test_fit_strategy_steps.py).

    before:  with strategy.scope(): model = build();   model.fit(ds, epochs=2)
    after:   with strategy.scope(): model = build();   ss.tf2.fit(model, ds, epochs=2)

Logical devices must be configured before TensorFlow initializes, so the runs happen in a child process (this
file as a script); the test reads its record. The compared model's raw inputs are numeric: Keras 3's model.fit
under a strategy averages a first batch over the replicas to build the model, which string inputs cannot
take. ss.tf2.fit trains a model with string inputs under the strategy (its distributed dataset carries the
preprocessed features), and that is checked too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = "strategy.json"


def _child(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False, "constant_folding": False})
    import keras

    import smartstage.tf2 as sst

    rng = np.random.default_rng(0)
    x = {"user": rng.integers(0, 20, (64, 1)), "age": rng.uniform(10, 80, (64, 1)).astype("float32"),
         "income": rng.normal(5, 2, (64, 1)).astype("float32")}
    y = rng.uniform(size=(64, 1)).astype("float32")

    def dataset():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def functional():
        #   user -> Hashing(one_hot) ----------------------\
        #   age -> Discretization -> CategoryEncoding ------> Concatenate -> Dense(8) -> Dense(1)
        #   income -> Normalization (adapted) -------------/
        keras.utils.set_random_seed(1)
        inputs = {"user": keras.Input((1,), dtype="int64", name="user"), "age": keras.Input((1,), name="age"),
                  "income": keras.Input((1,), name="income")}
        norm = keras.layers.Normalization(axis=None, name="income_norm")
        norm.adapt(x["income"])
        features = keras.layers.Concatenate(name="concat")([
            keras.layers.Hashing(num_bins=8, output_mode="one_hot", name="user_hash")(inputs["user"]),
            keras.layers.CategoryEncoding(4, output_mode="one_hot", name="age_bucket")(
                keras.layers.Discretization(bin_boundaries=[20.0, 40.0, 60.0], name="age_bins")(inputs["age"])),
            norm(inputs["income"])])
        hidden = keras.layers.Dense(8, activation="relu", name="hidden")(features)
        model = keras.Model(inputs, keras.layers.Dense(1, name="score")(hidden))
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
        return model

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        reference, model = functional(), functional()
    reference.fit(dataset(), epochs=2, verbose=0)
    history = sst.fit(model, dataset(), epochs=2, verbose=0)
    split = history.smartstage
    record = {
        "history": history.history, "expected_history": reference.history.history,
        "weights_identical": all(np.array_equal(a, b) for a, b in zip(reference.get_weights(), model.get_weights())),
        "evaluate": model.evaluate(dataset(), verbose=0), "expected_evaluate": reference.evaluate(dataset(), verbose=0),
        "moved": sorted(split.moved_layers), "replicas": split.trainer.distribute_strategy.num_replicas_in_sync,
        "trainer_inputs": [str(t.dtype) for t in split.trainer.inputs],
    }

    # String inputs: Keras 3's model.fit under a strategy averages a first batch over the replicas to build the
    # model, which strings cannot take; the distributed dataset of ss.tf2.fit carries preprocessed features.
    from tests.tf2.keras_models import preprocessing_model, raw_dataset

    with strategy.scope():
        strings = preprocessing_model()
    try:
        strings.fit(raw_dataset(), epochs=1, verbose=0)
        record["model_fit_on_strings"] = "trained"
    except tf.errors.InvalidArgumentError:
        record["model_fit_on_strings"] = "InvalidArgumentError"
    with strategy.scope():
        strings = preprocessing_model()
    before = [w.copy() for w in strings.get_weights()]
    strings_history = sst.fit(strings, raw_dataset(), epochs=1, verbose=0)
    record["split_fit_on_strings"] = {
        "loss": strings_history.history["loss"],
        "trained": any(not np.array_equal(a, b) for a, b in zip(before, strings.get_weights()))}
    (out / RECORD).write_text(json.dumps(record))


def test_fit_under_mirrored_strategy_is_model_fit_under_it(run_eager_child):
    record = run_eager_child(__file__, RECORD)
    assert record["replicas"] == 2
    assert record["moved"] == ["age_bins", "age_bucket", "concat", "income_norm", "user_hash"]
    assert record["trainer_inputs"] == ["float32"]          # the distributed dataset carries preprocessed features
    assert record["history"] == record["expected_history"]
    assert record["weights_identical"]
    assert record["evaluate"] == record["expected_evaluate"]
    assert record["model_fit_on_strings"] == "InvalidArgumentError"
    assert record["split_fit_on_strings"]["trained"] and record["split_fit_on_strings"]["loss"][0] > 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _child(Path(sys.argv[1]))
