"""ss.tf2.fit keeps model.fit's loop on the step route: class_weight, sample weights in the dataset,
steps_per_execution, metrics reset for evaluate(), one split for several calls, the model's own functions
back after the call (on error too), and save/reload on raw features.

    before:  model.fit(ds, class_weight={0: 1.0, 1: 3.0}, epochs=2)
    after:   ss.tf2.fit(model, ds, class_weight={0: 1.0, 1: 3.0}, epochs=2)     # the same losses and weights
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import smartstage.tf2 as sst
from smartstage.tf2.keras.model_step import TRAIN_STEP, split_model_step
from tests.tf2 import fit_models as fm
from tests.tf2.fit_support import assert_same_weights, batch_losses, identical, raw_features  # noqa: F401
from tests.tf2.keras_models import preprocessing_model, raw_dataset

pytestmark = pytest.mark.usefixtures("eager", "identical")
RANKER_KEYS = ("user", "item", "age")


def _both(factory, train, **fit_kwargs):
    reference = factory()
    expected = batch_losses(reference)
    reference.fit(train, callbacks=[expected], verbose=0, **fit_kwargs)
    model = factory()
    got = batch_losses(model)
    history = sst.fit(model, train, callbacks=[got], verbose=0, **fit_kwargs)
    return reference, model, expected.losses, got.losses, history


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")), (fm.keras3_subclassed, RANKER_KEYS)],
                         ids=["tf_keras", "keras3"])
def test_class_weight_and_sample_weights(factory, keys):
    for train, extra in ((fm.dataset(keys), {"class_weight": {0: 1.0, 1: 3.0}}),
                         (fm.dataset(keys, weights=True), {})):
        reference, model, expected, got, history = _both(factory, train, epochs=2, **extra)
        assert len(got) == 12 and got == expected
        assert history.history == reference.history.history
        assert_same_weights(reference, model)
    unweighted = factory()
    unweighted.fit(fm.dataset(keys), epochs=2, verbose=0)
    assert unweighted.history.history["loss"] != reference.history.history["loss"]  # the weights took effect


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")), (fm.keras3_subclassed, RANKER_KEYS)],
                         ids=["tf_keras", "keras3"])
def test_steps_per_execution(factory, keys):
    train = fm.dataset(keys)
    reference, model, expected, got, history = _both(lambda: factory(steps_per_execution=3), train, epochs=2)
    assert len(got) == 2 * 6 // 3 and got == expected  # one callback call per execution of 3 steps
    assert_same_weights(reference, model)


def test_evaluate_after_fit_reports_the_evaluation_only():
    # metric objects passed to compile are shared by whatever trains them; evaluate() must start from zero
    def factory():
        model = preprocessing_model()
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.MeanAbsoluteError()])
        return model

    reference, model, *_ = _both(factory, raw_dataset(), epochs=1)
    assert model.evaluate(raw_dataset(seed=2), verbose=0) == reference.evaluate(raw_dataset(seed=2), verbose=0)


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")),
                                          (fm.keras3_subclassed, RANKER_KEYS)], ids=["tf_keras", "keras3"])
def test_split_once_while_nothing_changes(factory, keys):
    model, train = factory(), fm.dataset(keys)
    first = sst.fit(model, train, epochs=1, verbose=0).smartstage.train
    again = sst.fit(model, fm.dataset(keys, seed=3), epochs=1, verbose=0).smartstage.train
    assert again is first                                               # same model, same element spec
    other_spec = sst.fit(model, fm.dataset(keys).unbatch().batch(8, drop_remainder=True), epochs=1, verbose=0)
    assert other_spec.smartstage.train is not first                     # a static batch size: a new trace
    optimizer = type(model.optimizer)(0.01)
    model.compile(optimizer, model.loss)
    recompiled = sst.fit(model, train, epochs=1, verbose=0).smartstage.train
    assert recompiled is not first and recompiled is not other_spec.smartstage.train
    assert optimizer.iterations.numpy() == 6                          # the new optimizer is the one that trained


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")),
                                          (fm.keras3_subclassed, RANKER_KEYS)], ids=["tf_keras", "keras3"])
def test_a_second_fit_traces_nothing_again(factory, keys, monkeypatch):
    from smartstage.tf2.step import functions

    model = factory()
    split = sst.fit(model, fm.dataset(keys), epochs=1, verbose=0).smartstage.train
    built = split.functions["train_function"]
    assert built is not None and model.__dict__.get("train_function") is not built   # the model's own again
    imports = []
    real_import = functions._import
    monkeypatch.setattr(functions, "_import", lambda *a, **k: imports.append(1) or real_import(*a, **k))
    assert sst.fit(model, fm.dataset(keys, seed=3), epochs=1, verbose=0).smartstage.train is split
    assert split.functions["train_function"] is built                    # Keras's train function, kept
    assert imports == []                                                 # neither side imported again
    assert model.fit(fm.dataset(keys), epochs=1, verbose=0).history["loss"]   # model.fit: its own function


def test_a_layer_split_is_reused_while_nothing_changes():
    model = preprocessing_model()
    first = sst.fit(model, raw_dataset(), epochs=1, verbose=0).smartstage
    assert sst.fit(model, raw_dataset(seed=3), epochs=1, verbose=0).smartstage is first
    model.compile(keras.optimizers.Adam(0.01), "mse")
    assert sst.fit(model, raw_dataset(), epochs=1, verbose=0).smartstage is not first


class _Boom(Exception):
    pass


@pytest.mark.parametrize("factory,keys,base", [(fm.ranking_tf_keras, ("user", "item"), tf_keras.callbacks.Callback),
                                               (fm.keras3_subclassed, RANKER_KEYS, keras.callbacks.Callback)],
                         ids=["tf_keras", "keras3"])
def test_the_models_own_functions_are_back_after_an_error(factory, keys, base):
    class FailSecondBatch(base):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise _Boom()

    model, train = factory(), fm.dataset(keys)
    model.fit(train, epochs=1, verbose=0)
    own = model.train_function
    with pytest.raises(_Boom):
        sst.fit(model, train, epochs=1, verbose=0, callbacks=[FailSecondBatch()])
    assert model.train_function is own and "train_step" not in vars(model) and "test_step" not in vars(model)
    reference = factory()
    reference.fit(train, epochs=1, verbose=0)
    reference.fit(train.take(2), epochs=1, verbose=0)   # what the failed call trained: two batches
    assert_same_weights(reference, model)


def test_tf_keras_subclassed_saves_and_reloads_serving_raw_features(tmp_path):
    model, keys = fm.ranking_tf_keras(), ("user", "item")
    sst.fit(model, fm.dataset(keys), epochs=1, verbose=0)
    raw = raw_features(keys)
    expected = model.predict(raw, verbose=0)
    model.save(str(tmp_path / "ranking"))                               # SavedModel: the lookups inside
    reloaded = tf_keras.models.load_model(str(tmp_path / "ranking"))
    np.testing.assert_array_equal(reloaded.predict(raw, verbose=0), expected)
    model.save_weights(str(tmp_path / "weights"))
    fresh = fm.ranking_tf_keras()
    fresh(raw)
    fresh.load_weights(str(tmp_path / "weights"))
    np.testing.assert_array_equal(fresh.predict(raw, verbose=0), expected)


def test_keras3_subclassed_saves_and_exports_serving_raw_features(tmp_path):
    model = fm.keras3_subclassed()
    sst.fit(model, fm.dataset(RANKER_KEYS), epochs=1, verbose=0)
    raw = raw_features(RANKER_KEYS)
    expected = model.predict(raw, verbose=0)
    model.save_weights(tmp_path / "ranker.weights.h5")
    fresh = fm.keras3_subclassed()
    fresh(raw)
    fresh.load_weights(tmp_path / "ranker.weights.h5")
    np.testing.assert_array_equal(fresh.predict(raw, verbose=0), expected)
    signature = [{k: tf.TensorSpec((None, 1), v.dtype, name=k) for k, v in raw.items()}]  # a subclassed model's
    model.export(str(tmp_path / "served"), verbose=False, input_signature=signature)   # inputs are not typed
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(raw).numpy(), expected, rtol=1e-6)


def test_a_split_step_is_reused_only_for_its_element_spec():
    model = fm.ranking_tf_keras()
    first = split_model_step(model, TRAIN_STEP, fm.dataset(("user", "item")))
    assert split_model_step(model, TRAIN_STEP, fm.dataset(("user", "item"), seed=4)) is first
    assert split_model_step(model, TRAIN_STEP, fm.dataset(("user", "item"), weights=True)) is not first
    again = split_model_step(model, TRAIN_STEP, fm.dataset(("user", "item")))
    model.score.trainable = False                                        # what trains changed
    assert split_model_step(model, TRAIN_STEP, fm.dataset(("user", "item"))) is not again


def _ids_dataset():
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensor_slices(
        (rng.integers(0, 50, (32, 3)), rng.uniform(size=(32, 1)).astype("float32"))).batch(8)


def _sequential(family):
    #   ids -> Hashing(16) -> Embedding -> GlobalAveragePooling1D -> Dense      (no Input: no layer graph)
    family.utils.set_random_seed(1)
    model = family.Sequential([family.layers.Hashing(16), family.layers.Embedding(16, 4),
                               family.layers.GlobalAveragePooling1D(), family.layers.Dense(1)])
    model.compile(family.optimizers.Adam(0.01), "mse")
    return model


@pytest.mark.parametrize("family", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_sequential_without_input_and_a_checkpoint_during_fit(family, tmp_path):
    path = str(tmp_path / ("best.keras" if family is keras else "best"))  # tf_keras: a SavedModel directory
    reference = _sequential(family)
    reference.fit(_ids_dataset(), epochs=2, verbose=0)
    model = _sequential(family)
    history = sst.fit(model, _ids_dataset(), epochs=2, verbose=0,
                      callbacks=[family.callbacks.ModelCheckpoint(path, monitor="loss")])
    assert type(history.smartstage).__name__ == "StepFit"
    assert history.history == reference.history.history
    assert_same_weights(reference, model)
    ids = next(iter(_ids_dataset()))[0]
    saved = family.models.load_model(path)                  # saved by the callback, during the split fit
    np.testing.assert_array_equal(saved.predict(ids, verbose=0), model.predict(ids, verbose=0))


def test_the_step_route_on_tf_data_service_workers():
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
               for _ in range(2)]
    try:
        model = fm.ranking_tf_keras()
        model(raw_features(("user", "item")))          # built, so the weights before training can be read
        losses = batch_losses(model)
        before = [w.copy() for w in model.get_weights()]
        assert before
        history = sst.fit(model, fm.dataset(("user", "item")), epochs=2, callbacks=[losses], verbose=0,
                          tf_data_service=dispatcher.target)
        assert "LookupTableFindV2" in {n.op for n in history.smartstage.train.split.traced.graph_def.node
                                       if n.name in history.smartstage.train.split.moved}
        assert len(history.history["loss"]) == 2 and len(losses.losses) >= 12   # each worker batches its share
        assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        assert model.train_function is None and "train_step" not in vars(model)
    finally:
        for worker in workers:
            worker._stop()  # noqa: SLF001  (TensorFlow's own tests stop servers this way)
        dispatcher._stop()  # noqa: SLF001


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")), (fm.keras3_subclassed, RANKER_KEYS)],
                         ids=["tf_keras", "keras3"])
def test_verify_a_step_split_trains_nothing(factory, keys):
    model = factory()
    history = sst.fit(model, fm.dataset(keys), epochs=1, verbose=0)
    weights = [w.copy() for w in model.get_weights()]
    check = history.smartstage.train.verify(fm.dataset(keys, seed=7), steps=4)
    assert check.identical, check.describe()
    assert check.describe().startswith("identical: 4 step(s)")
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")), (fm.keras3_subclassed, RANKER_KEYS)],
                         ids=["tf_keras", "keras3"])
def test_shuffled_with_a_fixed_seed(factory, keys):
    # Each epoch reshuffles. A dataset object's shuffle continues its sequence from one iteration (one fit
    # epoch) to the next, so each program gets a dataset of its own, built with the same seeds.
    reference = factory()
    expected = batch_losses(reference)
    reference.fit(fm.dataset(keys, shuffle_seed=3), epochs=3, verbose=0, callbacks=[expected])
    model = factory()
    got = batch_losses(model)
    sst.fit(model, fm.dataset(keys, shuffle_seed=3), epochs=3, verbose=0, callbacks=[got])
    assert len(got.losses) == 18 and got.losses == expected.losses
    assert_same_weights(reference, model)
    unshuffled = factory()
    unshuffled.fit(fm.dataset(keys), epochs=3, verbose=0)
    assert unshuffled.history.history["loss"] != reference.history.history["loss"]  # the shuffle took effect


class _PythonFirstTestStep(tf_keras.Sequential):
    """Its test step hands the batch to Python first (numpy_function never moves), so nothing of it can move."""

    def test_step(self, data):
        x, y = (tf.numpy_function(lambda a: a, [t], t.dtype, stateful=False) for t in data)
        return super().test_step((tf.ensure_shape(x, [None, 3]), tf.ensure_shape(y, [None, 1])))


def test_validation_runs_unsplit_when_nothing_of_the_test_step_can_move():
    def build():
        tf_keras.utils.set_random_seed(1)
        model = _PythonFirstTestStep([tf_keras.layers.Hashing(16), tf_keras.layers.Embedding(16, 4),
                                      tf_keras.layers.GlobalAveragePooling1D(), tf_keras.layers.Dense(1)])
        model.compile(tf_keras.optimizers.Adam(0.01), "mse")
        return model

    reference, model, expected, got, history = _both(build, _ids_dataset(), epochs=2, validation_data=_ids_dataset())
    assert history.smartstage.test is None and history.smartstage.train.split.moved
    assert got == expected and history.history == reference.history.history and "val_loss" in history.history
    assert_same_weights(reference, model)


@pytest.mark.parametrize("factory,keys", [(fm.ranking_tf_keras, ("user", "item")), (fm.keras3_subclassed, RANKER_KEYS)],
                         ids=["tf_keras", "keras3"])
def test_the_split_cache_lets_a_model_go(factory, keys):
    import gc
    import weakref

    from smartstage.tf2.keras import model_step as keras_step

    model = factory()
    split_model_step(model, TRAIN_STEP, fm.dataset(keys))
    assert model in keras_step._CACHE
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None                       # nothing the cache holds refers back to the model
