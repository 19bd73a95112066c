"""What the ss.tf2.fit tests share: the settings under which two programs give bit-identical floats, a callback
that records every batch's loss for either Keras (benchmarks.fit_rounds.batch_losses, which the fit
benchmarks compare with), and comparisons.

    pytestmark = pytest.mark.usefixtures("eager", "identical")
    losses = batch_losses(model); model.fit(ds, callbacks=[losses]); losses.losses -> [0.69, 0.68, ...]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from benchmarks.fit_rounds import batch_losses  # noqa: F401  (the tests import it from here)
from tests.tf2 import fit_models as fm


_GRAPPLER = ("arithmetic_optimization", "constant_folding")


@pytest.fixture
def identical():
    """Op determinism on (a reduction's order is fixed, so a program run twice gives the same bits), and Grappler's
    arithmetic optimizer and constant folding off: they rewrite float arithmetic in the step's graph (a
    division by a constant among it) but not the same ops in the dataset's map function, so an op that moved
    would differ in the last bit. For both programs; all put back afterwards."""
    determinism = tf_config.is_op_determinism_enabled()
    before = tf.config.optimizer.get_experimental_options()
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False, "constant_folding": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({name: before.get(name, True) for name in _GRAPPLER})
        if not determinism:
            tf_config.disable_op_determinism()




def assert_same_weights(expected_model, model) -> None:
    expected, got = expected_model.get_weights(), model.get_weights()
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


def raw_features(keys, samples: int = 8, seed: int = 5) -> dict:
    x, _ = fm.columns(samples, seed)
    return {k: tf.constant(x[k]) for k in keys}
