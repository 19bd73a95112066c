"""The placement of a Keras model (smartstage.tf2.strategy.placement): OneDevice under the default strategy and
Distributed under a 2-replica MirroredStrategy, each asked every question fit asks it: the scope, the checks
of the step route, whether the trial times, the build, how the step is split, how the dataset is cut and
mapped, how fit runs, what the summary says, and whether verify() runs.

    before:  strategy = model.distribute_strategy;  if strategy is not None: ... else: ...
    after:   placement = placement_of(model);  placement.split_step(model, "train_step", ds, ...)

Logical devices must be configured before TensorFlow initializes, so the questions are asked in a child
process (this file as a script); the test reads its record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = "placement.json"


def _refusal(call) -> str:
    from smartstage.errors import SplitError

    try:
        call()
    except SplitError as e:
        return str(e)
    return "ran"


def _child(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False, "constant_folding": False})

    from smartstage.tf2.keras.model_step import TRAIN_STEP, replaced_steps, split_model_step
    from smartstage.tf2.strategy.placement import ONE_DEVICE, Distributed, OneDevice, placement_of
    from smartstage.tf2.strategy.replica_step import ReplicaStep
    from tests.tf2 import fit_models as fm

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    keys = ("user", "item")

    def data():  # 48 rows in batches of 8
        return fm.dataset(keys)

    record = {}
    alone = fm.ranking_tf_keras()
    with strategy.scope():
        mirrored = fm.ranking_tf_keras()
    with one_device.scope():
        other = fm.ranking_tf_keras()
    local, replicated = placement_of(alone), placement_of(mirrored)
    record["of"] = {
        "default": local is ONE_DEVICE and isinstance(local, OneDevice) and local.strategy is None,
        "mirrored": isinstance(replicated, Distributed) and replicated.strategy is strategy
        and replicated == Distributed(strategy),
        "one_device_strategy": type(placement_of(other)).__name__,
    }
    with local.scope():
        local_scope = tf.distribute.has_strategy()
    with replicated.scope():
        replicated_scope = tf.distribute.get_strategy() is strategy
    record["scope"] = {"one_device": local_scope, "distributed": replicated_scope}
    record["timed"] = {"one_device": local.timed, "distributed": replicated.timed}
    service = "grpc://localhost:5050"
    record["check_steps"] = {
        "one_device": _refusal(lambda: local.check_steps(alone, service)),
        "mirrored": _refusal(lambda: replicated.check_steps(mirrored, None)),
        "mirrored_service": _refusal(lambda: replicated.check_steps(mirrored, service)),
        "one_device_strategy": _refusal(lambda: placement_of(other).check_steps(other, None)),
    }

    # build / prepare_steps: a Keras 3 model is built for the raw batches before its step is traced per
    # replica (under the strategy's scope); a tf_keras model builds on its first call, and on one device the
    # trace builds what is not built.
    keras3_data = fm.dataset(("user", "item", "age"))
    with strategy.scope():
        keras3 = fm.keras3_subclassed()
    keras3_alone, built_alone = fm.keras3_subclassed(), fm.keras3_subclassed()
    ONE_DEVICE.prepare_steps(keras3_alone, keras3_data)
    replicated.prepare_steps(mirrored, data())
    placement_of(keras3).prepare_steps(keras3, keras3_data)
    ONE_DEVICE.build(built_alone, keras3_data)
    record["prepare_steps"] = {
        "keras3_one_device": keras3_alone.built, "tf_keras_distributed": mirrored.built,
        "keras3_distributed": keras3.built and keras3.optimizer.built,
        "build_one_device": built_alone.built and built_alone.optimizer.built,
    }
    first_batch = next(iter(data()))[0]
    alone(first_batch)
    with strategy.scope():
        mirrored(first_batch)

    # split_step, batches, map: the step as one tf.function, or per replica; batches of 8 rows, or slices of 4.
    halves = {name: placement.split_step(model, TRAIN_STEP, data(), autograph=True, deterministic=True)
              for name, placement, model in (("one_device", local, alone), ("distributed", replicated, mirrored))}
    record["split_step"] = {name: {"moved": len(h.moved), "replica_step": isinstance(h.step, ReplicaStep)}
                            for name, h in halves.items()}
    record["batches"] = {name: [int(tf.nest.flatten(e)[0].shape[0]) for e in placement.batches(data())]
                         for name, placement in (("one_device", local), ("distributed", replicated))}
    record["map"] = {name: len(list(placement.map(data(), halves[name])))
                     for name, placement in (("one_device", local), ("distributed", replicated))}
    record["describe"] = {"one_device": local.describe(), "distributed": replicated.describe()}
    record["check_verify"] = {"one_device": _refusal(lambda: local.check_verify("ranking.train_step")),
                              "distributed": _refusal(lambda: replicated.check_verify("ranking.train_step"))}

    # The split cache keys the placement by its strategy: another Distributed of the same strategy reuses it.
    with strategy.scope():
        cached = fm.ranking_tf_keras()
        cached(first_batch)
    first = split_model_step(cached, TRAIN_STEP, data(), placement=placement_of(cached))
    record["cache_reused"] = split_model_step(cached, TRAIN_STEP, data(), placement=Distributed(strategy)) is first

    # run_fit: the model's own fit on the split, as model.fit trains the same model on the raw batches.
    runs = {}
    for name, scope in (("one_device", ONE_DEVICE.scope), ("distributed", strategy.scope)):
        with scope():
            reference, model = fm.ranking_tf_keras(), fm.ranking_tf_keras()
            reference(first_batch)
            model(first_batch)
        model.set_weights(reference.get_weights())
        placement = placement_of(model)
        train = split_model_step(model, TRAIN_STEP, data(), placement=placement)
        expected = reference.fit(data(), epochs=2, verbose=0)
        with replaced_steps(model, {TRAIN_STEP: train}):
            history = placement.run_fit(model, train, None, data(), None, None, None, {"epochs": 2, "verbose": 0})
        runs[name] = {"history": history.history == expected.history,
                      "weights": all(np.array_equal(a, b) for a, b in zip(reference.get_weights(),
                                                                           model.get_weights()))}
    record["run_fit"] = runs
    (out / RECORD).write_text(json.dumps(record))


def test_each_placement_answers_what_fit_asks_it(run_eager_child):
    record = run_eager_child(__file__, RECORD)
    assert record["of"] == {"default": True, "mirrored": True, "one_device_strategy": "Distributed"}
    assert record["scope"] == {"one_device": False, "distributed": True}
    assert record["timed"] == {"one_device": True, "distributed": False}
    checks = record["check_steps"]
    assert checks["one_device"] == "ran" and checks["mirrored"] == "ran"
    assert "tf.data service" in checks["mirrored_service"] and "drop tf_data_service=" in checks["mirrored_service"]
    assert "OneDeviceStrategy" in checks["one_device_strategy"] and "MirroredStrategy only" in \
        checks["one_device_strategy"]
    assert record["prepare_steps"] == {"keras3_one_device": False, "tf_keras_distributed": False,
                                       "keras3_distributed": True, "build_one_device": True}
    split = record["split_step"]
    assert split["one_device"]["moved"] > 0 and not split["one_device"]["replica_step"]
    assert split["distributed"]["moved"] > 0 and split["distributed"]["replica_step"]
    assert record["batches"] == {"one_device": [8] * 6, "distributed": [4] * 12}
    assert record["map"] == {"one_device": 6, "distributed": 12}
    assert record["describe"]["one_device"] == ""
    assert record["describe"]["distributed"].startswith(" under MirroredStrategy (2 replicas;")
    assert record["check_verify"]["one_device"] == "ran"
    assert "ranking.train_step is split for MirroredStrategy" in record["check_verify"]["distributed"]
    assert "compare ss.tf2.fit with model.fit" in record["check_verify"]["distributed"]
    assert record["cache_reused"]
    assert record["run_fit"] == {"one_device": {"history": True, "weights": True},
                                 "distributed": {"history": True, "weights": True}}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _child(Path(sys.argv[1]))
