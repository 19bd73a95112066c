"""fit(): `model.fit` with the model's input preprocessing moved into the dataset, for every kind of Keras model.

    before:  model.fit(ds, epochs=3, validation_data=val)
    after:   ss.tf2.fit(model, ds, epochs=3, validation_data=val)   # same losses and weights; the model is yours

Two routes, one partition (the op-level one of ss.tf2.split):
- layers: a Keras 3 functional or Sequential model with the stock train and test steps is cut at layer level
  (smartstage.tf2.keras.layers). The trainer half is compiled like the model (its optimizer, loss and metric
  objects, resolved jit_compile) and fit on the mapped dataset; the user's callbacks see the user's model.
- steps: every other model (Keras 3 subclassed, tf_keras of any kind, an overridden train_step or test_step)
  has its own train step split at op level (smartstage.tf2.keras.model_step), and its own `fit` runs on the mapped
  dataset.

Both routes reuse the split of the previous call while the model and the element spec are unchanged. Every
refusal is a SplitError raised before the model, its compile state or the dataset is touched.

With measure=True (the default) a new split is timed against the model's own step first, on copies of the
model's state (smartstage.tf2.step.trial): when the split program runs slower, the model trains with model.fit as
it is, and `history.smartstage` (a NotSplit) says by how much. The verdict is kept with the split.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from smartstage.errors import NothingToMoveError, SplitError
from smartstage.tf2.keras.layers import KerasSplit, compile_like, graph_model, split_model
from smartstage.tf2.keras.model_step import (TEST_STEP, TRAIN_STEP, ModelStepSplit, is_compiled, keras_family,
                                             model_key, replaced_steps, split_model_step, steps_per_execution)
from smartstage.tf2.step.trial import Verdict, time_eager_steps, time_split, time_steps
from smartstage.tf2.step.user_state import check_state_on, model_state_variables, unchanged
from smartstage.tf2.strategy.placement import Placement, placement_of, step_function

logger = logging.getLogger(__name__)

_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
          "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end")
# model.fit arguments that describe in-memory data, which a dataset already carries.
_DATA_ARGUMENTS = {
    "y": "the labels are the dataset's second component: tf.data.Dataset.from_tensor_slices((x, y)).batch(n)",
    "sample_weight": "put the weights in the dataset as its third component: ((x, y, sample_weight))",
    "validation_split": "pass validation_data=<a batched tf.data.Dataset> instead",
    "batch_size": "batch the dataset itself (dataset.batch(n))",
    "validation_batch_size": "batch the validation dataset itself",
}
# Keras 3 models split at layer level, keyed like step splits (model_step.model_key); an entry holds its model,
# so the id names no other model while the entry lives, and only the last LAYER_SPLITS_KEPT models are kept.
LAYER_SPLITS_KEPT = 8
_LAYER_SPLITS: "OrderedDict[int, tuple[tuple, KerasSplit, Any]]" = OrderedDict()


@dataclass(frozen=True)
class NotSplit:
    """What `ss.tf2.fit` did when nothing of the model is worth moving: trained it with `model.fit` as it is."""

    reason: str

    def summary(self) -> str:
        return f"not split: {self.reason}; trained with model.fit as it is"


@dataclass(frozen=True)
class StepFit:
    """What the step route split: the train step, and the test step when validation data was given."""

    train: ModelStepSplit
    test: ModelStepSplit | None = None

    def summary(self) -> str:
        parts = [self.train.summary()] + ([self.test.summary()] if self.test is not None else [])
        return "\n".join(parts)


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


def _check_dataset(name: str, dataset) -> None:
    if dataset is not None and not isinstance(dataset, tf.data.Dataset):
        raise SplitError(f"fit(): {name} is a {type(dataset).__name__}; pass a batched tf.data.Dataset of (features, "
                         "labels) (tf.data.Dataset.from_tensor_slices((x, y)).batch(n) for arrays)")


def _check_arguments(model, fit_kwargs: dict) -> None:
    import difflib
    import inspect

    known = inspect.signature(type(model).fit).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in known.values()):
        for name in fit_kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, list(known), n=1)
                raise SplitError(f"fit(): {type(model).fit.__qualname__} takes no argument {name!r}"
                                 + (f"; did you mean {close[0]!r}?" if close else "; drop it"))
    for name, fix in _DATA_ARGUMENTS.items():
        value = fit_kwargs.get(name)
        if value is not None and not (isinstance(value, (int, float)) and value == 0):
            raise SplitError(f"fit(): {name}= describes in-memory arrays, and ss.tf2.fit takes a dataset; {fix}")
    if not is_compiled(model):
        raise SplitError(f"fit(): model {model.name!r} is not compiled; call model.compile(optimizer, loss, ...) "
                         "before ss.tf2.fit(model, ...), as before model.fit")


def _uses_stock_steps(model) -> bool:
    import keras

    return all(getattr(type(model), m) is getattr(keras.Model, m) for m in (TRAIN_STEP, TEST_STEP))


def _layer_split(model, dataset: tf.data.Dataset, deterministic: bool, placement: Placement) -> KerasSplit | None:
    """The cached or new layer-level split of a Keras 3 functional model with stock steps; None when the layer
    route does not apply (another kind of model). SplitError when no layer can move."""
    if keras_family(model) != "keras" or not _uses_stock_steps(model):
        return None
    try:
        graph_model(model)
    except SplitError:
        return None
    # The model's own compile state is built before the trainer updates the metric objects they share, so
    # model.evaluate() resets them as after model.fit (and reports the evaluation only).
    placement.build(model, dataset)
    with placement.scope():
        key = (model_key(model, None), deterministic)
        cached = _LAYER_SPLITS.get(id(model))
        if cached is not None and cached[0] == key and cached[1].model is model:
            return cached[1]
        # Under a strategy the trainer is a model of that strategy, as the user's model is.
        halves = split_model(model, deterministic=deterministic)
        compile_like(halves.trainer, model)
    _LAYER_SPLITS[id(model)] = (key, halves, model)
    _LAYER_SPLITS.move_to_end(id(model))
    while len(_LAYER_SPLITS) > LAYER_SPLITS_KEPT:
        _LAYER_SPLITS.popitem(last=False)
    return halves


def _with_class_weight(model, dataset: tf.data.Dataset, class_weight) -> tf.data.Dataset:
    """The dataset with class weights as sample weights, as model.fit maps it (before the split sees it)."""
    if keras_family(model) == "keras":
        from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn
    else:
        from tf_keras.src.engine.data_adapter import _make_class_weight_map_fn as make_class_weight_map_fn
    return dataset.map(make_class_weight_map_fn(class_weight))


def _check_pays(model, verdict: Verdict) -> None:
    """NothingToMoveError (fit trains the model as it is) when the timed split ran slower than the model."""
    if not verdict.pays:
        raise NothingToMoveError(f"fit(): splitting {model.name!r} does not pay: {verdict.text()}",
                                 reason=f"measured: {verdict.text()}")
    logger.info("fit(%s): %s", model.name, verdict.text())


def _timed(model, halves, dataset: tf.data.Dataset, measure: bool, tf_data_service: str | None,
           placement: Placement) -> None:
    """Times a new split against the model's own train step (once per split: the verdict is kept with it);
    NothingToMoveError when it does not pay. Not timed: measure=False, a tf.data service (the trial would
    run a job on it) and a placement the trial does not time (a distribution strategy: its variables are not
    copied)."""
    if not measure or tf_data_service is not None or not placement.timed:
        return
    if TRAIN_STEP not in halves.trials:
        per_call = steps_per_execution(model)
        if isinstance(halves, ModelStepSplit):
            halves.trials[TRAIN_STEP] = time_split(halves.split, dataset, in_function=True, steps_per_call=per_call)
        elif model.run_eagerly:  # fit runs the steps as Python: timed as fit runs them
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            halves.trials[TRAIN_STEP] = time_eager_steps(
                (halves.trainer.train_step, halves.map(dataset)), (model.train_step, dataset),
                model_state_variables(model))
        else:
            own = step_function(model, TRAIN_STEP, autograph=False)
            trainer = step_function(halves.trainer, TRAIN_STEP, autograph=False)
            halves.trials[TRAIN_STEP] = time_steps((trainer, halves.map(dataset)), (own, dataset), [model],
                                                   steps_per_call=per_call)
    _check_pays(model, halves.trials[TRAIN_STEP])


def _fit_layers(model, halves: KerasSplit, dataset, validation_data, callbacks, tf_data_service, fit_kwargs):
    wrapped = [_on_user_model(c, model, halves.trainer) for c in (callbacks or ())]
    model.stop_training = False
    history = halves.trainer.fit(halves.map(dataset, tf_data_service), callbacks=wrapped,
                                 validation_data=None if validation_data is None else halves.map(validation_data),
                                 **fit_kwargs)
    history.smartstage = halves
    history.set_model(model)
    return history


def _fit_steps(model, placement: Placement, dataset, validation_data, callbacks, deterministic, tf_data_service,
               measure, check, fit_kwargs):
    placement.check_steps(model, tf_data_service)
    if model.run_eagerly:
        raise SplitError(f"fit(): model {model.name!r} is compiled with run_eagerly=True, which runs its train step "
                         "as Python on every batch, and a split step is a traced function; compile it with "
                         "run_eagerly=False for ss.tf2.fit, or debug it with model.fit")
    class_weight = fit_kwargs.pop("class_weight", None)
    if class_weight is not None:
        dataset = _with_class_weight(model, dataset, class_weight)
    placement.prepare_steps(model, dataset)
    with unchanged(f"fit({model.name!r}) deciding its split", model, (dataset, validation_data), on=check):
        train = split_model_step(model, TRAIN_STEP, dataset, deterministic=deterministic, placement=placement)
        _timed(model, train, dataset, measure, tf_data_service, placement)
        test = None
        if validation_data is not None:
            try:
                test = split_model_step(model, TEST_STEP, validation_data, deterministic=deterministic,
                                        placement=placement)
            except NothingToMoveError:
                logger.info("fit(%s): nothing of the test step can move; validation runs as model.evaluate",
                            model.name)
    logger.info("fit(%s): step route, %d op(s) of the train step moved", model.name, len(train.split.moved))
    splits = {TRAIN_STEP: train} if test is None else {TRAIN_STEP: train, TEST_STEP: test}
    with replaced_steps(model, splits):
        history = placement.run_fit(model, train, test, dataset, validation_data, callbacks, tf_data_service,
                                    fit_kwargs)
    history.smartstage = StepFit(train, test)
    return history


def fit(model, dataset: tf.data.Dataset, *, validation_data: tf.data.Dataset | None = None, callbacks=None,
        deterministic: bool = True, split: KerasSplit | None = None, tf_data_service: str | None = None,
        measure: bool = True, check_state: bool | None = None, **fit_kwargs) -> Any:
    """Trains `model` on `dataset` as model.fit would, with its input preprocessing moved into the dataset.

    model: a compiled Keras 3 or tf_keras model of any kind. dataset / validation_data: batched
    tf.data.Datasets of raw features ((x, y) or (x, y, sample_weight)), as model.fit takes them.
    deterministic: batches in input order (False is an explicit opt-out). split: what an earlier call put in
    `history.smartstage` (a KerasSplit is reused as it is; after a StepFit or NotSplit, fit reuses the split it
    keeps for the model, or trains it as it is), or a split_model() result. tf_data_service: a dispatcher address: the training dataset, preprocessing included,
    runs on tf.data service workers (validation data stays local). measure: time a new split against the
    model's own step on copies of its state (a few seconds, once per split) and train the model as it is when
    the split runs slower (smartstage.tf2.step.trial); False splits whatever it measures. check_state: snapshot
    the user's state (variables, seeds and generators, the dataset's next iteration) before deciding and
    raise StateChangedError if deciding changed any of it (a debug check; default: SMARTSTAGE_CHECK_STATE=1
    in the environment turns it on). fit_kwargs: the rest of
    model.fit's arguments (epochs, class_weight, steps_per_epoch, ...). Returns the History;
    `history.smartstage` is what was split (its summary() says what moved), or a NotSplit saying why not.

        before:  history = model.fit(ds, epochs=3)
        after:   history = ss.tf2.fit(model, ds, epochs=3)
    """
    if "tfdata_service" in fit_kwargs:
        from smartstage.tf2.step.service import renamed_service

        old = {"tfdata_service": fit_kwargs.pop("tfdata_service")}
        tf_data_service = renamed_service("fit()", tf_data_service, old)
    keras_family(model)
    _check_dataset("dataset", dataset)
    _check_dataset("validation_data", validation_data)
    if fit_kwargs.get("x") is not None:
        raise SplitError("fit(): the data is the second argument, ss.tf2.fit(model, dataset, ...); drop x=")
    _check_arguments(model, fit_kwargs)
    if tf_data_service is not None:
        from smartstage.tf2.step.service import check_address

        tf_data_service = check_address(tf_data_service)
    check = check_state_on(check_state)
    placement = placement_of(model)
    try:
        if isinstance(split, NotSplit):  # a fit that trained the model as it is: again
            raise NothingToMoveError(split.summary(), reason=split.reason)
        if isinstance(split, StepFit):  # the step route keeps its splits per model: reused while unchanged
            split = None
        if split is not None and not isinstance(split, KerasSplit):
            raise SplitError(f"fit(): split= takes what history.smartstage held after an earlier ss.tf2.fit of this "
                             f"model (KerasSplit, StepFit or NotSplit), not a {type(split).__name__}; drop split= "
                             "and fit decides again")
        with unchanged(f"fit({model.name!r}) deciding its split", model, (dataset, validation_data),
                       on=check and split is None):
            halves = split or _layer_split(model, dataset, deterministic, placement)
            if halves is not None and split is None:
                _timed(model, halves, dataset, measure, tf_data_service, placement)
        if halves is None:
            return _fit_steps(model, placement, dataset, validation_data, callbacks, deterministic, tf_data_service,
                              measure, check, dict(fit_kwargs))
    except NothingToMoveError as e:
        # Splitting would only add a map, or was timed slower: the model trains exactly as model.fit trains it,
        # and says why.
        reason = e.reason
        logger.warning("fit(%s): not split (%s); training with model.fit as it is", model.name, reason)
        history = model.fit(dataset, validation_data=validation_data, callbacks=callbacks, **fit_kwargs)
        history.smartstage = NotSplit(reason)
        return history
    if split is not None:
        compile_like(halves.trainer, model)
    logger.info("fit(%s): layer route, %d layer call(s) moved", model.name, len(halves.moved_layers))
    return _fit_layers(model, halves, dataset, validation_data, callbacks, tf_data_service, fit_kwargs)


__all__ = ["NotSplit", "StepFit", "compile_like", "fit"]
