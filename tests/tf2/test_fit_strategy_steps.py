"""ss.tf2.fit's step route under tf.distribute.MirroredStrategy (two logical CPU devices): tf_keras functional and
subclassed models, models with their own train_step and test_step, and a Keras 3 subclassed model train with
each replica's preprocessing in the distributed dataset, and every loss, metric, weight and evaluation equals
model.fit under the same strategy, from the same initial weights.

    before:  with strategy.scope(): model = Ranking();   model.fit(ds, epochs=2, validation_data=val)
    after:   with strategy.scope(): model = Ranking();   ss.tf2.fit(model, ds, epochs=2, validation_data=val)

Logical devices are configured before TensorFlow initializes, so the runs happen in a child process (this file
as a script); the tests read its record. Two models of a kind are built alike and then given the same weights
(a subclassed model builds on its first batch, after other draws of the global seed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

RECORD = "strategy_steps.json"
KINDS = ("ctr_tf_keras", "ranking_tf_keras", "custom_step_tf_keras", "keras3_numeric", "custom_step_keras3",
         "ctr_steps_per_execution", "ranking_class_weight")


def _keras3_numeric(clipped: bool = False):
    """A Keras 3 subclassed ranker on numeric ids (Keras 3's own model.fit under a strategy cannot take string
    inputs: it averages a first batch over the replicas), with hashing, a discretization and embeddings;
    `clipped`: with its own train_step (gradients clipped by value)."""
    import keras

    from tests.tf2.fit_models import ClippedModel

    class NumericRanker(keras.Model):
        def __init__(self):
            super().__init__(name="numeric_ranker")
            self.users = keras.layers.Hashing(num_bins=16, name="users")
            self.ages = keras.layers.Discretization(bin_boundaries=[20.0, 40.0, 60.0], name="ages")
            self.user_embedding = keras.layers.Embedding(16, 4, name="user_embedding")
            self.age_embedding = keras.layers.Embedding(4, 4, name="age_embedding")
            self.score = keras.layers.Dense(1, name="score")

        def call(self, x):
            u = self.user_embedding(self.users(x["user_id"][:, 0]))
            a = self.age_embedding(self.ages(x["age"][:, 0]))
            return self.score(keras.ops.concatenate([u * a, u], 1))

    class ClippedRanker(NumericRanker):
        train_step = ClippedModel.train_step  # gradients clipped by value, metrics updated by hand

    keras.utils.set_random_seed(1)
    model = ClippedRanker() if clipped else NumericRanker()
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError(name="mae")])
    return model


def _child(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False, "constant_folding": False})

    import smartstage.tf2 as sst
    from smartstage.tf2.strategy.replicas import per_replica_dataset
    from tests.tf2 import fit_models as fm

    # The per-replica slices against the dataset tf.distribute builds for the replicas of one worker.
    slices = {}
    for replicas in (2, 3):
        devices = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        for rows, batch, drop in ((30, 10, False), (25, 10, False), (9, 4, False), (49, 8, False), (5, 5, False),
                                  (2, 8, False), (20, 6, True)):
            ids = tf.data.Dataset.range(rows)
            ragged = ids.map(lambda i: {"id": i, "seq": tf.range(i % 3)})
            for name, data in (("dense", ids.batch(batch, drop_remainder=drop)),
                               ("ragged", ragged.ragged_batch(batch, drop_remainder=drop))):
                expected = devices.experimental_distribute_dataset(data)._cloned_datasets[0]
                got = per_replica_dataset(devices, data)
                flat = [[v.numpy().tolist() if not isinstance(v, tf.RaggedTensor) else v.to_list()
                         for v in tf.nest.flatten(e)] for e in got]
                want = [[v.numpy().tolist() if not isinstance(v, tf.RaggedTensor) else v.to_list()
                         for v in tf.nest.flatten(e)] for e in expected]
                slices[f"{replicas} replicas, {rows} rows, batch {batch}, drop {drop}, {name}"] = flat == want
    record = {"slices": slices}

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def numeric_dataset(seed: int = 0, samples: int = 52):
        rng = np.random.default_rng(seed)
        x = {"user_id": rng.integers(0, 40, (samples, 1)), "age": rng.uniform(10, 80, (samples, 1)).astype("float32")}
        return tf.data.Dataset.from_tensor_slices((x, rng.uniform(size=(samples, 1)).astype("float32"))).batch(8)

    kinds = {
        # kind: (build, training data, validation data); 52 rows leave a last batch of 4, split 2 + 2.
        # (Keras 3's own model.fit under a strategy fails with steps_per_execution > 1 on these models.)
        "ctr_tf_keras": (fm.ctr_tf_keras, lambda: fm.dataset(samples=52), lambda: fm.dataset(samples=24, seed=1)),
        "ranking_tf_keras": (fm.ranking_tf_keras, lambda: fm.dataset(("user", "item"), samples=52, weights=True),
                             lambda: fm.dataset(("user", "item"), samples=24, seed=1, weights=True)),
        "custom_step_tf_keras": (fm.custom_step_tf_keras, lambda: fm.dataset(("user", "item"), samples=52),
                                 lambda: fm.dataset(("user", "item"), samples=24, seed=1)),
        "keras3_numeric": (_keras3_numeric, numeric_dataset, lambda: numeric_dataset(1, 24)),
        "custom_step_keras3": (lambda: _keras3_numeric(clipped=True), numeric_dataset, None),
        "ctr_steps_per_execution": (lambda: fm.ctr_tf_keras(steps_per_execution=2), lambda: fm.dataset(samples=52),
                                    None),
        "ranking_class_weight": (fm.ranking_tf_keras, lambda: fm.dataset(("user", "item"), samples=52), None),
    }
    fit_arguments = {"ranking_class_weight": {"class_weight": {0: 1.0, 1: 3.0}}}
    for kind, (build, data, validation) in kinds.items():
        with strategy.scope():
            reference, model = build(), build()
            first = next(iter(data()))[0]
            reference(first)
            model(first)
        model.set_weights(reference.get_weights())
        val = None if validation is None else validation
        arguments = fit_arguments.get(kind, {})
        expected = reference.fit(data(), epochs=2, verbose=0, validation_data=val and val(), **arguments)
        history = sst.fit(model, data(), epochs=2, verbose=0, validation_data=val and val(), **arguments)
        split = history.smartstage
        again = sst.fit(model, data(), epochs=1, verbose=0, **arguments)  # the split is reused
        reference.fit(data(), epochs=1, verbose=0, **arguments)
        entry = {
            "history": history.history, "expected_history": expected.history,
            "weights_identical": all(np.array_equal(a, b) for a, b in zip(reference.get_weights(),
                                                                           model.get_weights())),
            "evaluate": model.evaluate(data(), verbose=0), "expected_evaluate": reference.evaluate(data(), verbose=0),
            "summary": split.summary(), "moved": len(split.train.split.moved),
            "test_split": split.test is not None, "reused": again.smartstage.train is split.train,
            "steps_restored": "train_step" not in vars(model) and "test_step" not in vars(model),
        }
        # Nothing half-applied: model.fit trains the model as it trains the reference.
        model.fit(data(), epochs=1, verbose=0)
        reference.fit(data(), epochs=1, verbose=0)
        entry["model_fit_after"] = all(np.array_equal(a, b) for a, b in zip(reference.get_weights(),
                                                                            model.get_weights()))
        record[kind] = entry

    # Keras 3 subclassed on strings: model.fit under a strategy fails on its first batch; ss.tf2.fit trains.
    with strategy.scope():
        strings = fm.keras3_subclassed()
    history = sst.fit(strings, fm.dataset(("user", "item", "age")), epochs=1, verbose=0)
    record["keras3_strings"] = {"loss": history.history["loss"], "moved": len(history.smartstage.train.split.moved)}
    from smartstage.errors import SplitError

    # Refused before anything changes: another strategy, a tf.data service job, verify() of a replica split.
    refused = {}
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    with one_device.scope():
        ranking = fm.ranking_tf_keras()
    with strategy.scope():
        mirrored = fm.ranking_tf_keras()
    for name, call in (
            ("one_device", lambda: sst.fit(ranking, fm.dataset(("user", "item")), epochs=1, verbose=0)),
            ("tf_data_service", lambda: sst.fit(mirrored, fm.dataset(("user", "item")), epochs=1, verbose=0,
                                               tf_data_service="grpc://localhost:5050")),
            ("verify", lambda: split.train.verify(fm.dataset(("user", "item"))))):
        try:
            call()
            refused[name] = "ran"
        except SplitError as e:
            refused[name] = str(e)
    refused["untouched"] = all("train_step" not in vars(m) and not m.built for m in (ranking, mirrored))
    record["refused"] = refused
    (out / RECORD).write_text(json.dumps(record))


@pytest.mark.slow
def test_step_route_under_mirrored_strategy_is_model_fit_under_it(run_eager_child):
    record = run_eager_child(__file__, RECORD)
    assert record["slices"] and all(record["slices"].values()), record["slices"]
    for kind in KINDS:
        entry = record[kind]
        assert entry["history"] == entry["expected_history"], kind
        assert entry["weights_identical"], kind
        assert entry["evaluate"] == entry["expected_evaluate"], kind
        assert entry["moved"] > 0 and "under MirroredStrategy (2 replicas" in entry["summary"], kind
        assert entry["reused"] and entry["steps_restored"] and entry["model_fit_after"], kind
    for kind in ("ctr_tf_keras", "ranking_tf_keras", "custom_step_tf_keras", "keras3_numeric"):
        assert record[kind]["test_split"], kind
        assert "val_loss" in record[kind]["history"], kind
    assert record["keras3_strings"]["moved"] > 0 and record["keras3_strings"]["loss"][0] > 0
    refused = record["refused"]
    assert "OneDeviceStrategy" in refused["one_device"] and "MirroredStrategy only" in refused["one_device"]
    assert "tf.data service" in refused["tf_data_service"] and "drop tf_data_service=" in refused["tf_data_service"]
    assert "compare ss.tf2.fit with model.fit" in refused["verify"]
    assert refused["untouched"]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _child(Path(sys.argv[1]))
