"""ss.tf2.fit on a Keras 3 functional model with StringLookup, Hashing, Discretization, CategoryEncoding and an
adapted Normalization inside: the preprocessing runs in the dataset, losses and weights are identical to
model.fit for 56 steps, and the user's model evaluates, saves, reloads, exports and predicts on raw features.

    before:  model.fit(ds, epochs=7)
    after:   ss.tf2.fit(model, ds, epochs=7)
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import smartstage.tf2 as sst
from tests.tf2.fit_support import batch_losses
from tests.tf2.keras_models import preprocessing_model, raw_arrays, raw_dataset

pytestmark = pytest.mark.usefixtures("eager")
EPOCHS = 7  # 8 batches an epoch: 56 steps


@pytest.fixture(scope="module")
def trained():
    """(the model trained by model.fit, the model trained by ss.tf2.fit, their batch losses, the History)."""
    with context.eager_mode():
        yield _train_both()


def _train_both():
    reference = preprocessing_model()
    reference_losses = batch_losses(reference)
    reference.fit(raw_dataset(), epochs=EPOCHS, callbacks=[reference_losses], verbose=0)
    model = preprocessing_model()
    losses = batch_losses(model)
    # untimed: a module fixture is set up before conftest's fit_splits_untimed applies
    history = sst.fit(model, raw_dataset(), epochs=EPOCHS, callbacks=[losses], verbose=0, measure=False)
    return reference, model, reference_losses.losses, losses.losses, history


def test_losses_and_weights_identical_to_model_fit(trained):
    reference, model, expected, got, history = trained
    assert len(got) == len(expected) == 56
    assert got == expected
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert history.history["loss"] == reference.history.history["loss"]


def test_the_preprocessing_layers_moved_and_the_dense_layers_stayed(trained):
    split = trained[4].smartstage
    assert set(split.moved_layers) == {"city_lookup", "tag_hash", "age_bins", "age_bucket", "income_norm", "concat"}
    kept = {v.layer: v.reason for v in split.verdicts if not v.moved}
    assert set(kept) == {"hidden", "score"} and "trainable weights" in kept["hidden"]
    # the trainer holds the user's own layer objects: one set of weights
    assert split.trainer.get_layer("hidden") is split.model.get_layer("hidden")
    assert "moved city_lookup (StringLookup)" in split.summary()


def test_evaluate_save_reload_export_predict_on_raw_features(trained, tmp_path):
    reference, model, *_ = trained
    assert model.evaluate(raw_dataset(), verbose=0) == reference.evaluate(raw_dataset(), verbose=0)
    raw = {k: tf.constant(v) for k, v in raw_arrays(16, seed=3)[0].items()}
    expected = reference.predict(raw, verbose=0)
    np.testing.assert_array_equal(model.predict(raw, verbose=0), expected)
    model.save(tmp_path / "ranker.keras")
    reloaded = keras.models.load_model(tmp_path / "ranker.keras")
    np.testing.assert_array_equal(reloaded.predict(raw, verbose=0), expected)
    model.export(str(tmp_path / "served"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(raw).numpy(), expected, rtol=1e-6)


def test_user_callbacks_see_the_users_model(tmp_path):
    model = preprocessing_model()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="loss")
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)  # stops after epoch 2
    history = sst.fit(model, raw_dataset(), epochs=5, callbacks=[checkpoint, stop], verbose=0)
    assert len(history.history["loss"]) == 2
    saved = keras.models.load_model(tmp_path / "best.keras")
    assert "city_lookup" in [layer.name for layer in saved.layers]  # the whole model, preprocessing included


def test_validation_data_is_mapped_too():
    reference = preprocessing_model()
    expected = reference.fit(raw_dataset(), validation_data=raw_dataset(16, 5), epochs=2, verbose=0).history
    got = sst.fit(preprocessing_model(), raw_dataset(), validation_data=raw_dataset(16, 5), epochs=2,
                  verbose=0).history
    assert got["val_loss"] == expected["val_loss"] and got["loss"] == expected["loss"]


def test_model_fit_goes_on_where_the_split_fit_stopped():
    # the optimizer (its iteration count and slots) is the user's: plain model.fit continues the same run
    reference = preprocessing_model()
    reference.fit(raw_dataset(), epochs=2, verbose=0)
    expected = reference.fit(raw_dataset(), epochs=1, verbose=0).history["loss"]
    model = preprocessing_model()
    sst.fit(model, raw_dataset(), epochs=2, verbose=0)
    assert model.fit(raw_dataset(), epochs=1, verbose=0).history["loss"] == expected
    assert int(model.optimizer.iterations) == int(reference.optimizer.iterations) == 24


def test_fit_with_its_preprocessing_on_tf_data_service_workers():
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
               for _ in range(2)]
    try:
        model = preprocessing_model()
        losses = batch_losses(model)
        before = [w.copy() for w in model.get_weights()]
        history = sst.fit(model, raw_dataset(), epochs=2, callbacks=[losses], verbose=0,
                          tf_data_service=dispatcher.target)
        assert len(history.history["loss"]) == 2
        # the source is split between the workers, which batch what they get: at least the 8 batches an epoch
        assert len(losses.losses) >= 16
        assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    finally:
        for worker in workers:
            worker._stop()  # noqa: SLF001  (TensorFlow's own tests stop servers this way)
        dispatcher._stop()  # noqa: SLF001
