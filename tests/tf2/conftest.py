"""The TF2 tests run in eager mode, TensorFlow 2's default, inside a suite whose conftest turned it off.

    pytestmark = pytest.mark.usefixtures("eager")   # a test module that needs TF2's eager mode

`context.eager_mode()` is the scope TensorFlow's own tests use to run a block eagerly in a graph-mode process;
nothing leaks out of it, so the v1 tests that run in the same process keep their graph mode.
"""

from __future__ import annotations

import pytest
from tensorflow.python.eager import context


@pytest.fixture
def eager():
    """Eager execution for one test (tf.function, tf.data iteration, Keras fit), as in a user's TF2 script."""
    with context.eager_mode():
        yield
