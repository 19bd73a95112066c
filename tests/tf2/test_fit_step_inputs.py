"""ss.tf2.fit on a step that edits the batch it is given: Keras's loop hands train_step a fresh structure each
batch, so a step may pop its label out of a feature dict (as tensorflow_recommenders' Model.compute_loss does);
the split must allow the same and train bit-identically to model.fit.

    before:  model.fit(ds)                 # ds yields {"user": ..., "item": ..., "rating": ...}
    after:   ss.tf2.fit(model, ds)         # same losses and weights; the lookups ran in the dataset
"""

from __future__ import annotations

import pytest
import tensorflow as tf
import tf_keras

import smartstage.tf2 as sst
from tests.tf2 import fit_models as fm
from tests.tf2.fit_support import assert_same_weights, batch_losses, identical  # noqa: F401

pytestmark = pytest.mark.usefixtures("eager", "identical")


class PopsItsLabel(tf_keras.Model):
    """tf_keras subclassed; train_step takes one dict and pops the label out of it."""

    def __init__(self):
        super().__init__(name="pops_its_label")
        self.users = tf_keras.layers.StringLookup(vocabulary=fm.USERS, name="users")
        self.embedding = tf_keras.layers.Embedding(len(fm.USERS) + 1, 4, name="embedding")
        self.score = tf_keras.layers.Dense(1, name="score")

    def call(self, features):
        return self.score(self.embedding(self.users(features["user"][:, 0])))

    def train_step(self, features):
        label = features.pop("rating")
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(label, self(features, training=True))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        return {"loss": loss}


def _model():
    tf_keras.utils.set_random_seed(1)
    model = PopsItsLabel()
    model({"user": tf.constant([["u1"]])})             # weights made now, from this seed
    model.compile(tf_keras.optimizers.SGD(0.1), "mse")
    return model


def _dataset():
    x, y = fm.columns()
    return tf.data.Dataset.from_tensor_slices({"user": x["user"], "rating": y}).batch(fm.BATCH)


def test_a_step_that_pops_its_label_trains_as_model_fit():
    reference, model = _model(), _model()
    expected, got = batch_losses(reference), batch_losses(model)
    reference.fit(_dataset(), epochs=2, callbacks=[expected], verbose=0)
    history = sst.fit(model, _dataset(), epochs=2, callbacks=[got], verbose=0)

    assert len(got.losses) == 12 and got.losses == expected.losses
    assert_same_weights(reference, model)
    ops = {node.name: node.op for node in history.smartstage.train.split.traced.graph_def.node}
    assert "LookupTableFindV2" in {ops[name] for name in history.smartstage.train.split.moved if name in ops}
