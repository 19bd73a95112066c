"""`tf.layers` and `tf.keras` of a DeepRec script: TensorFlow 2.21's legacy Keras (the tf-keras package).

TensorFlow 2.21's own `tf.compat.v1.layers` answers `dense is not available with Keras 3` unless
TF_USE_LEGACY_KERAS=1 was set before TensorFlow loaded Keras. The namespace takes the layers from
tf_keras directly (the module TensorFlow itself would load with that variable), so it works whatever
the script imported first and without changing the process's environment.

    before:  import tensorflow as tf; tf.compat.v1.layers.dense(x, 4)    # AttributeError with Keras 3
    after:   from smartstage.compat import tf; tf.layers.dense(x, 4)     # tf_keras's legacy layer
"""

from __future__ import annotations

import functools
import inspect
import types

import tensorflow as _tf

from smartstage.errors import ConfigError
from .namespace import Namespace

TF_KERAS_REQUIREMENT = "tf-keras>=2.21,<2.22"


def legacy_keras_v1() -> types.ModuleType:
    """tf_keras's TensorFlow 1 API (what `tf.compat.v1.keras` is with TF_USE_LEGACY_KERAS=1)."""
    try:
        from tf_keras.api._v1 import keras
    except ImportError as error:
        raise ConfigError(
            f"tf.layers and tf.keras of a DeepRec script need the legacy Keras on TensorFlow 2.21: "
            f"pip install '{TF_KERAS_REQUIREMENT}' (smartstage declares it; your environment lacks it)"
        ) from error
    return keras


def _tf1_kernel_initializer(function):
    """`function` with TensorFlow 1's default kernel initializer when the caller gives none.

    tf_keras's default (its TF2 GlorotUniform) draws a fresh seed per call, so two runs of the same
    script start from different weights whatever tf.set_random_seed says; TensorFlow 1 (and DeepRec)
    used tf.compat.v1.glorot_uniform_initializer, seeded by the graph seed and the op's position.
    """
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("kernel_initializer") is None:
            bound.arguments["kernel_initializer"] = _tf.compat.v1.glorot_uniform_initializer()
        return function(*bound.args, **bound.kwargs)

    return call


def legacy_layers() -> types.ModuleType:
    """tf_keras's `tf.compat.v1.layers` (dense, batch_normalization, dropout, conv2d, ...), with TF1's
    default kernel initializer (seeded by tf.set_random_seed) for every layer that has one."""
    module = legacy_keras_v1().__internal__.legacy.layers
    own = {}
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or not callable(value):
            continue
        if inspect.isclass(value):
            if "kernel_initializer" in inspect.signature(value.__init__).parameters:
                own[name] = type(name, (value,), {"__init__": _tf1_kernel_initializer(value.__init__),
                                                  "__module__": __name__})
        elif "kernel_initializer" in inspect.signature(value).parameters:
            own[name] = _tf1_kernel_initializer(value)
    return Namespace(__name__ + ".layers", module, own)
