"""An emulated accelerator for the examples: the model's compute as a wait of T ms that uses no host CPU.

SmartStage pays most where the model runs on an accelerator and the host CPU waits for it (DeepRec's
case: DLRM on an A100, ~5 ms a step). No GPU here, so the device is emulated: a `numpy_function` that
sleeps T ms (`time.sleep` releases the GIL and burns no CPU) on a value derived from the step's loss,
so it cannot start before the forward pass has read this step's features. The host keeps what a GPU
job keeps on the host: reading, parsing, preprocessing (wherever the pipeline puts them) and the
step's small host-side ops (embedding gathers and sparse updates of a tiny model).

    model = with_device_step(build_dlrm(..., options=device_options("dlrm")), device_ms=5.0)
    sess.run(model.train_op)     # forward on the host -> 5 ms device wait || backward + update -> done

In TF2, call `device_wait(loss, 5.0)` inside the `tf.function` step and return (or add 0 x) its result.

The wait holds one inter-op thread for T ms, as a host thread blocked on a device sync would; a real
device's launches and copies cost host CPU that the emulation leaves out (the tiny model's host ops
stand in for them).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import numpy as np
import tensorflow as tf

from smartstage.examples.options import DLRMOptions, ModelGraph, WideDeepOptions


def device_wait(x: tf.Tensor, device_ms: float, name: str = "emulated_device") -> tf.Tensor:
    """`x` again (same value, dtype and shape), produced after a host-idle wait of `device_ms`.

        loss = device_wait(loss, 5.0)   # before: loss ready after the forward pass
                                        # after:  the same loss, 5 ms later, no CPU used meanwhile
    """
    seconds = float(device_ms) / 1000.0

    def _wait(value: np.ndarray) -> np.ndarray:
        time.sleep(seconds)
        return value

    with tf.name_scope(name):
        out = tf.numpy_function(_wait, [x], x.dtype, stateful=True, name="wait")
        out.set_shape(x.shape)
    return out


def with_device_step(model: ModelGraph, device_ms: float) -> ModelGraph:
    """The same model whose `train_op` also waits `device_ms` on a value of this step's loss.

        model = with_device_step(build_dlrm(...), 5.0)   # before: train_op = the optimizer's update
                                                         # after:  train_op = group(update, wait(loss))
    The wait runs beside the backward pass and the update (they overlap, as a device's kernels overlap
    the host), after the forward pass; `model.loss` is unchanged, so losses compare across devices.
    """
    if device_ms <= 0:
        return model
    with model.graph.as_default():
        waited = device_wait(model.loss, device_ms)
        train_op = tf.group(model.train_op, waited, name="train_op_with_device")
    return dataclasses.replace(model, train_op=train_op)


def device_options(model: Literal["dlrm", "wide_deep"]) -> DLRMOptions | WideDeepOptions:
    """The benchmark's preprocessing with a tiny model: the host's share of a device step stays small.

        device_options("dlrm")   # before: DLRMOptions.benchmark(): 16-dim embeddings, MLPs of 64 (CPU-bound)
                                 # after:  the same features, 4-dim embeddings, MLPs of 8 (host ops ~1-2 ms)
    """
    if model == "dlrm":
        return dataclasses.replace(DLRMOptions.benchmark(), embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,))
    if model == "wide_deep":
        return dataclasses.replace(WideDeepOptions.benchmark(), embedding_dim=4, deep_mlp=(8,))
    raise ValueError(f"device_options: unknown model {model!r}; use 'dlrm' or 'wide_deep'")
