"""SmartStage for TensorFlow 2: a `tf.function` training step, or a Keras model's fit, with its input
preprocessing moved into the tf.data pipeline (docs/tf2.md).

    split = ss.tf2.split(train_step, dataset)       # for batch in split.dataset: split.step(batch)
    history = ss.tf2.fit(model, dataset, epochs=3)  # any Keras model: its preprocessing runs in the dataset
    check = ss.tf2.verify(train_step, dataset, steps=50)    # split vs unsplit, step by step

Three rooms, each importing only the ones before it:

    step      one tf.function step split in two: traced (trace), its captured state classified (state), its graph
              partitioned at its inputs (analysis), the two sides cut out (smartstage.graph.rewrites) and rebuilt as
              the dataset's map function and the main step (functions); split() and SplitStep (split), the timed trial
              (trial), the user-state check (user_state), verify() (compare)
    strategy  where a Keras model's variables live (placement: one device, or a strategy's replicas), and the
              step split per replica under MirroredStrategy (replicas, replica_step, replica_keys)
    keras     a Keras model: fit() and its route (fit), the model's own step split at op level (model_step),
              a Keras 3 functional model cut at layer level (layers)
"""

from __future__ import annotations

import importlib

_LAZY = {
    "smartstage.tf2.step.split": ("SplitStep", "split"),
    "smartstage.tf2.keras.layers": ("KerasSplit", "LayerVerdict", "split_model", "verify_fit"),
    "smartstage.tf2.keras.model_step": ("ModelStepSplit",),
    # history.smartstage after fit(): NotSplit, StepFit (of ModelStepSplits) or KerasSplit
    "smartstage.tf2.keras.fit": ("NotSplit", "StepFit", "fit"),
    "smartstage.tf2.step.trial": ("Verdict",),  # SplitStep.trial with split(measure=True)
    "smartstage.tf2.step.compare": ("StepCheck", "same_batches", "verify"),
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
