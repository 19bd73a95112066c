"""fit(): Keras 3 `model.fit` with the model's preprocessing layers run in the dataset.

    before:  model.fit(ds, epochs=3)
    after:   ss.tf2.fit(model, ds, epochs=3)      # same losses; model.save()/export() still serve raw features

The trainer half (smartstage.tf2.keras_split) is compiled like the user's model, with the user's optimizer
object, loss, metrics and the model's resolved jit_compile (the trainer alone would otherwise turn XLA on,
which changes float results), then fit on the mapped dataset. The user's callbacks see the user's model:
ModelCheckpoint saves the whole model, EarlyStopping's stop reaches the trainer's loop.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from smartstage.errors import SplitError
from smartstage.tf2.keras_split import KerasSplit, split_model

logger = logging.getLogger(__name__)

_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
          "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end")


def _on_user_model(callback, model, trainer):
    """A callback that forwards every hook to `callback`, which sees the user's `model`; a stop it asks for
    (model.stop_training) stops the trainer's loop."""
    import keras

    class OnUserModel(keras.callbacks.Callback):
        def set_model(self, _trainer):
            super().set_model(_trainer)
            callback.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            callback.set_params(params)

    def forward(name):
        def hook(self, *args, **kwargs):
            getattr(callback, name)(*args, **kwargs)
            if getattr(model, "stop_training", False):
                trainer.stop_training = True
        hook.__name__ = name
        return hook

    for name in _HOOKS:
        setattr(OnUserModel, name, forward(name))
    return OnUserModel()


def compile_like(trainer, model) -> None:
    """Compiles `trainer` as `model` was compiled, sharing its optimizer object."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not getattr(model, "compiled", False) or config is None or getattr(model, "optimizer", None) is None:
        raise SplitError(f"fit(): model {model.name!r} is not compiled; call model.compile(optimizer, loss, ...) "
                         "before ss.tf2.fit(model, ...), as before model.fit")
    trainer.compile(optimizer=model.optimizer, loss=config.get("loss"), loss_weights=config.get("loss_weights"),
                    metrics=config.get("metrics"), weighted_metrics=config.get("weighted_metrics"),
                    run_eagerly=config.get("run_eagerly", False),
                    steps_per_execution=config.get("steps_per_execution", 1), jit_compile=bool(model.jit_compile))


def _check_dataset(name: str, dataset) -> None:
    if dataset is not None and not isinstance(dataset, tf.data.Dataset):
        raise SplitError(f"fit(): {name} is a {type(dataset).__name__}; pass a batched tf.data.Dataset of (features, "
                         "labels) (tf.data.Dataset.from_tensor_slices((x, y)).batch(n) for arrays)")


def fit(model, dataset, *, validation_data=None, callbacks=None, deterministic: bool = True,
        split: KerasSplit | None = None, tfdata_service: str | None = None, **fit_kwargs) -> Any:
    """Trains `model` on `dataset` as model.fit would, with its preprocessing layers moved into the dataset.

    dataset / validation_data: batched tf.data.Datasets of raw features, as model.fit takes them.
    deterministic: batches in input order (False is an explicit opt-out). split: a split_model() result to
    reuse. tfdata_service: a dispatcher address: the training dataset, preprocessing included, runs on tf.data
    service workers (validation data stays local). fit_kwargs: the rest of model.fit's arguments (epochs, ...).
    Returns the History; `history.smartstage` is the KerasSplit (its summary() says what moved).

        before:  history = model.fit(ds, epochs=3)
        after:   history = ss.tf2.fit(model, ds, epochs=3)
    """
    _check_dataset("dataset", dataset)
    _check_dataset("validation_data", validation_data)
    if tfdata_service is not None:
        from smartstage.tf2.service import check_address

        tfdata_service = check_address(tfdata_service)
    halves = split or split_model(model, deterministic=deterministic)
    compile_like(halves.trainer, model)
    wrapped = [_on_user_model(c, model, halves.trainer) for c in (callbacks or ())]
    model.stop_training = False
    history = halves.trainer.fit(halves.map(dataset, tfdata_service), callbacks=wrapped,
                                 validation_data=None if validation_data is None else halves.map(validation_data),
                                 **fit_kwargs)
    history.smartstage = halves
    history.set_model(model)
    return history


__all__ = ["compile_like", "fit"]
