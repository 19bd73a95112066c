"""ss.tf2.fit trains every kind of Keras model as model.fit does: tf_keras functional (feature columns, sequence
features), tf_keras subclassed, Keras 3 subclassed, Keras 3 over a FeatureSpace, and overridden train steps.
Each model is trained twice from the same seeds, once by model.fit and once by ss.tf2.fit: every batch's loss,
every weight and the evaluation are bit-identical, and the model trained by ss.tf2.fit predicts, saves whole and
reloads on raw features.

Identity holds under the settings of the `identical` fixture (tests/tf2/fit_support.py, docs/tf2.md): op
determinism on and Grappler's arithmetic optimizer off, for both programs.

    before:  model.fit(ds, epochs=2, validation_data=val)
    after:   ss.tf2.fit(model, ds, epochs=2, validation_data=val)
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tf_keras

import smartstage.tf2 as sst
from tests.tf2 import fit_models as fm
from tests.tf2.fit_support import assert_same_weights, batch_losses, identical, raw_features  # noqa: F401

pytestmark = pytest.mark.usefixtures("eager", "identical")

HASH, LOOKUP = "StringToHashBucketFast", "LookupTableFindV2"
KINDS = {
    # kind: (factory, the dataset's feature keys, the route ss.tf2.fit takes, op types that must move)
    "tf_keras_ctr_feature_columns": (fm.ctr_tf_keras, ("user", "item", "age", "clicks"), "steps", {HASH, "Bucketize"}),
    "tf_keras_subclassed_ranking": (fm.ranking_tf_keras, ("user", "item"), "steps", {LOOKUP}),
    "keras3_subclassed": (fm.keras3_subclassed, ("user", "item", "age"), "steps", {HASH, LOOKUP}),
    "keras3_feature_space": (fm.keras3_feature_space, ("user", "item", "age"), "layers", set()),
    "keras3_custom_train_step": (fm.custom_step_keras3, ("user", "item"), "steps", {HASH, LOOKUP}),
    "tf_keras_custom_train_and_test_step": (fm.custom_step_tf_keras, ("user", "item"), "steps", {HASH, LOOKUP}),
}


def moved_op_types(step_split) -> set[str]:
    """The op types of the nodes a step split moved to the dataset."""
    ops = {node.name: node.op for node in step_split.split.traced.graph_def.node}
    return {ops[name] for name in step_split.split.moved if name in ops}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fit_is_model_fit(kind, tmp_path):
    factory, keys, route, moved = KINDS[kind]
    train, val = fm.dataset(keys), fm.dataset(keys, samples=16, seed=1)
    reference = factory()
    expected = batch_losses(reference)
    reference.fit(train, epochs=2, validation_data=val, callbacks=[expected], verbose=0)
    model = factory()
    got = batch_losses(model)
    history = sst.fit(model, train, epochs=2, validation_data=val, callbacks=[got], verbose=0)

    assert len(got.losses) == 12 and got.losses == expected.losses
    assert history.history == reference.history.history          # training and validation metrics
    assert_same_weights(reference, model)
    assert (type(history.smartstage).__name__ == "KerasSplit") == (route == "layers")
    if route == "steps":
        assert moved <= moved_op_types(history.smartstage.train)         # the preprocessing ran in the dataset
        assert moved <= moved_op_types(history.smartstage.test)          # validation's too
    else:
        moved_types = {v.op_type for v in history.smartstage.verdicts if v.moved}     # FeatureSpace's layers
        assert {"StringLookup", "Hashing", "Normalization", "CategoryEncoding"} <= moved_types
    # the model's own functions again: model.fit trains it as it trains the reference
    assert "train_step" not in vars(model) and model.train_function is None
    assert model.evaluate(val, verbose=0) == reference.evaluate(val, verbose=0)
    model.fit(train, epochs=1, verbose=0)
    reference.fit(train, epochs=1, verbose=0)
    assert_same_weights(reference, model)

    raw = raw_features(keys)
    expected_scores = reference.predict(raw, verbose=0)
    np.testing.assert_array_equal(model.predict(raw, verbose=0), expected_scores)
    np.testing.assert_array_equal(_reloaded(model, tmp_path).predict(raw, verbose=0), expected_scores)


def _reloaded(model, tmp_path):
    """The model saved whole and loaded back: a SavedModel for tf_keras, a .keras file for Keras 3."""
    if isinstance(model, tf_keras.Model):
        model.save(str(tmp_path / "saved"))
        return tf_keras.models.load_model(str(tmp_path / "saved"))
    model.save(tmp_path / "model.keras")
    return keras.models.load_model(tmp_path / "model.keras",
                                   custom_objects={"ClippedModel": fm.ClippedModel, "Keras3Ranker": fm.Keras3Ranker})
