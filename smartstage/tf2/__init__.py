"""SmartStage for TensorFlow 2: a `tf.function` training step, or a Keras model's fit, with its input
preprocessing moved into the tf.data pipeline (docs/tf2.md).

    split = ss.tf2.split(train_step, dataset)       # for batch in split.dataset: split.step(batch)
    history = ss.tf2.fit(model, dataset, epochs=3)  # any Keras model: its preprocessing runs in the dataset
    check = ss.tf2.verify(train_step, dataset, steps=50)    # split vs unsplit, step by step

    trace      the step traced for the dataset's element spec, with its checks
    state      what each captured tensor is (variable, read-only variable, table, value) and whether it may move
    analysis   the function graph as a v1 stage, partitioned by optimize()
    surgery    the two sides cut out of the function graph by edit records
    functions  the map function and the main tf.function built from them
    split      split() and SplitStep
    keras_split  Keras 3 functional models cut at layer level by the op-level partition
    keras_step   any Keras model's own train/test step split at op level, run by the model's own fit
    placement    where a model's variables live (one device, or a strategy's replicas): how its step is split,
                 its dataset cut and mapped, and its fit run
    keras_fit    fit(): chooses the route, refuses what it cannot train
    compare    verify() / verify_fit(): the split program against the original, step by step
"""

from __future__ import annotations

import importlib
import sys
import types

_LAZY = {
    "smartstage.tf2.split": ("SplitStep", "split"),
    "smartstage.tf2.keras_split": ("KerasSplit", "LayerVerdict", "split_model"),
    "smartstage.tf2.keras_step": ("ModelStepSplit",),
    # history.smartstage after fit(): NotSplit, StepFit (of ModelStepSplits) or KerasSplit
    "smartstage.tf2.keras_fit": ("NotSplit", "StepFit", "fit"),
    "smartstage.tf2.trial": ("Verdict",),  # SplitStep.trial with split(measure=True)
    "smartstage.tf2.compare": ("StepCheck", "same_batches", "verify", "verify_fit"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'smartstage.tf2' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """`smartstage.tf2.split` is the function whichever code loads the submodule of that name first: the import
    system binds a loaded submodule on its package, and that binding takes the function instead (the module
    stays in sys.modules, so `from smartstage.tf2.split import SplitStep` works as usual)."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _MODULE_OF.get(name) == value.__name__ and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
