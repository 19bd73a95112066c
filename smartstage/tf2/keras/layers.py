"""layers: a Keras 3 functional or Sequential model cut in two at layer level: the preprocessing layers
run in the dataset, the rest trains on the user's own layer objects.

    before:  raw -> StringLookup -> Hashing -> Normalization(adapted) -> Concatenate -> Dense -> Dense
    after:   preprocessing = Model(raw, [lookup, hashed, normalized])         # dataset.map(...)
             trainer = Model([lookup, hashed, normalized], Dense(Dense(Concatenate(...))))   # the same layers

Why layers, not ops: `fit` is Keras's loop (losses, metrics, callbacks, steps_per_execution, distribution);
a trainer that is a Keras model keeps all of it, and sharing layer objects shares every weight, so the
user's model still holds its preprocessing and serves raw features after training. Which layers move is
decided by the op-level partition: each call of a layer is traced alone (its inputs as the stage) and
analysed like any step (smartstage.tf2.step.analysis); it moves when it has no trainable weights, reads only
raw inputs or moved layers, is no model output, and the partition pins none of its ops (a write to
state, a random draw, a trained variable). Otherwise it stays, with that reason.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from smartstage.errors import NothingToMoveError, SplitError
from smartstage.inspection.replay import Run
from smartstage.tf2.step.analysis import analyse
from smartstage.tf2.step.compare import StepCheck, check_readable, compare_runs, same_batches
from smartstage.tf2.step.state import static_tables
from smartstage.tf2.step.trace import trace_step
from smartstage.tf2.step.user_state import SavedValues

logger = logging.getLogger(__name__)

# Pins that do not keep a layer in the model: its outputs are the traced call's outputs, and a cheap op the
# cut-cost rule recomputes on the main side of the call alone moves with its layer (the layer's output crosses).
_OUTPUT_PINS = ("target", "fetched_directly", "recompute")


@dataclass(frozen=True)
class LayerVerdict:
    """One layer call of the model: moved to the dataset, or kept in the model with the reason."""

    layer: str
    op_type: str
    moved: bool
    reason: str
    pinned_op: str = ""  # the op of the layer call that the partition pins (its graph: KerasSplit.analyses)


@dataclass(frozen=True)
class KerasSplit:
    """The user's model, and its two halves built from the same layer objects."""

    model: Any
    preprocessing: Any  # keras.Model: raw features -> the cut tensors
    trainer: Any  # keras.Model: the cut tensors -> the model's outputs
    verdicts: tuple[LayerVerdict, ...]
    cut: tuple[str, ...]  # the KerasTensor names the dataset carries, in order
    deterministic: bool = True
    analyses: dict = field(default_factory=dict, repr=False)  # layer name -> Analysis of its call
    trials: dict = field(default_factory=dict, repr=False, compare=False)  # fit()'s timed Verdict, kept with the split

    @property
    def moved_layers(self) -> tuple[str, ...]:
        return tuple(v.layer for v in self.verdicts if v.moved)

    def map(self, dataset: tf.data.Dataset, tf_data_service: str | None = None) -> tf.data.Dataset:
        """`dataset` (x, (x, y) or (x, y, sample_weight)) with x replaced by the preprocessed features; with
        `tf_data_service`, run on that dispatcher's workers (smartstage.tf2.step.service: at most once, no fixed
        order)."""
        preprocessing = self.preprocessing

        def prefetch_side(x, *rest):
            features = preprocessing(x, training=True)
            features = tuple(features) if isinstance(features, (list, tuple)) else (features,)
            return (features, *rest) if rest else features

        from smartstage.tf2.step.functions import mapped_dataset

        return mapped_dataset(dataset, prefetch_side, deterministic=self.deterministic, tf_data_service=tf_data_service)

    def explain(self, layer: str) -> str:
        """Why a layer call moved to the dataset or stays in the model; for a pin from the op-level partition,
        the chain from its cause (smartstage.inspection.explain on the layer call's analysis graph).

            split.explain("city_lookup")   # "layer 'city_lookup' (StringLookup) moved to the dataset: ..."
            split.explain("drop")          # "... stays in the model: its op ... reads variable ...\n  chain: ..."
        """
        found = [v for v in self.verdicts if v.layer == layer]
        if not found:
            import difflib

            close = difflib.get_close_matches(layer, [v.layer for v in self.verdicts], n=3)
            raise SplitError(f"explain(): model {self.model.name!r} has no layer call {layer!r}"
                             + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                f"; its layers: {', '.join(v.layer for v in self.verdicts)}"))
        lines = []
        for v in found:
            if v.moved:
                lines.append(f"layer {v.layer!r} ({v.op_type}) moved to the dataset: it has no trainable weights, "
                             "reads only raw inputs or moved layers, and no op of it stays in the step")
                continue
            lines.append(f"layer {v.layer!r} ({v.op_type}) stays in the model: {v.reason}")
            analysis = self.analyses.get(v.layer)
            if v.pinned_op and analysis is not None:
                from smartstage.inspection.explain import explain

                chain = explain(analysis.graph_def, v.pinned_op, result=analysis.result).chain
                if len(chain) > 1:
                    lines.append("  chain: " + " -> ".join(chain))
        return "\n".join(lines)

    def summary(self) -> str:
        lines = [f"Keras model {self.model.name!r}: {len(self.moved_layers)} layer call(s) moved to the dataset, "
                 f"{len(self.verdicts) - len(self.moved_layers)} kept in the model"]
        for v in self.verdicts:
            lines.append(f"  {'moved' if v.moved else 'kept '} {v.layer} ({v.op_type})"
                         + ("" if v.moved else f": {v.reason}"))
        lines.append(f"dataset carries ({len(self.cut)}): {', '.join(self.cut)}")
        lines.extend(f"timed: {v.text()}" for v in self.trials.values())
        return "\n".join(lines)


def compile_like(trainer, model) -> None:
    """Compiles `trainer` as `model` was compiled, sharing its optimizer, loss and metric objects.

        before:  model.compile(adam, "mse", metrics=[mae]);  trainer = split_model(model).trainer
        after:   compile_like(trainer, model)      # trainer.optimizer is adam, its metrics update mae
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not getattr(model, "compiled", False) or config is None or getattr(model, "optimizer", None) is None:
        raise SplitError(f"fit(): model {model.name!r} is not compiled; call model.compile(optimizer, loss, ...) "
                         "before ss.tf2.fit(model, ...), as before model.fit")
    trainer.compile(optimizer=model.optimizer, loss=config.get("loss"), loss_weights=config.get("loss_weights"),
                    metrics=config.get("metrics"), weighted_metrics=config.get("weighted_metrics"),
                    run_eagerly=config.get("run_eagerly", False),
                    steps_per_execution=config.get("steps_per_execution", 1), jit_compile=bool(model.jit_compile))


def graph_model(model):
    """The functional graph of `model` (a Sequential's inner functional); SplitError for a subclassed model."""
    import keras

    if not isinstance(model, keras.Model):
        raise SplitError(f"split_model(): {type(model).__name__} is not a Keras 3 model; a layer split follows a "
                         "Keras 3 functional or Sequential model's layer graph; ss.tf2.fit(model, dataset) trains "
                         "any Keras model (it splits the model's train step)")
    inner = getattr(model, "_functional", None) if isinstance(model, keras.Sequential) else model
    if inner is None or not hasattr(inner, "_nodes_by_depth"):
        kind = "a Sequential model without an Input" if isinstance(model, keras.Sequential) else \
            f"a subclassed model ({type(model).__name__})"
        raise SplitError(f"split_model(): {model.name!r} is {kind}: a layer split follows the connections "
                         "between layers, which only functional and Sequential models (built with keras.Input) "
                         "have; ss.tf2.fit(model, dataset) trains it by splitting its train step instead "
                         "(history.smartstage.train), or build it as keras.Model(inputs, outputs)")
    return inner


def _nodes(functional) -> list:
    """The model's layer calls from its inputs to its outputs."""
    return [node for depth in sorted(functional._nodes_by_depth, reverse=True)
            for node in functional._nodes_by_depth[depth]]


def _call_pins(node) -> tuple[str | None, Any, str]:
    """Why the op-level partition keeps this layer call in the model (None: every op may move), the analysis,
    and the op it pins ("" when none)."""
    operation = node.operation
    inputs = list(node.input_tensors)
    specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in inputs)
    takes_training = "training" in inspect.signature(operation.call).parameters if hasattr(operation, "call") else False

    def call(values):  # one argument, the tuple of the call's input tensors, whatever their number
        args, kwargs = node.arguments.fill_in({id(t): v for t, v in zip(inputs, values)})
        if takes_training:
            kwargs["training"] = True
        return operation(*args, **kwargs)

    step = tf.function(call, autograph=False)
    traced = trace_step(step, specs, check_retrace=False)
    analysis = analyse(traced, static_tables([operation]))
    for name, pin in analysis.partition.pinned.items():
        if pin.kind not in _OUTPUT_PINS:
            return f"its op {name!r} stays in the step: {pin.describe()}", analysis, name
    return None, analysis, ""


def split_model(model, *, deterministic: bool = True) -> KerasSplit:
    """The model cut at the last layer calls the dataset can run (module docstring).

        before:  model.fit(ds)
        after:   halves = split_model(model); halves.trainer.fit(halves.map(ds))   # ss.tf2.fit does this
    """
    import keras

    functional = graph_model(model)
    outputs = {id(t) for t in tf.nest.flatten(functional.output)}
    available = {id(t) for t in tf.nest.flatten(functional.input)}
    verdicts, analyses, kept_nodes = [], {}, []
    for node in _nodes(functional):
        operation = node.operation
        if isinstance(operation, keras.layers.InputLayer):
            continue
        reason, pinned_op = None, ""
        if getattr(operation, "trainable_weights", None):
            reason = f"it has trainable weights ({len(operation.trainable_weights)})"
        elif not all(id(t) in available for t in node.input_tensors):
            reason = "it reads a layer that stays in the model"
        elif any(id(t) in outputs for t in node.output_tensors):
            reason = "its output is an output of the model"
        else:
            reason, analyses[operation.name], pinned_op = _call_pins(node)
        verdicts.append(LayerVerdict(operation.name, type(operation).__name__, reason is None, reason or "",
                                     pinned_op))
        if reason is None:
            available.update(id(t) for t in node.output_tensors)
        else:
            kept_nodes.append(node)
    cut = list({id(t): t for node in kept_nodes for t in node.input_tensors if id(t) in available}.values())
    if not any(v.moved for v in verdicts) or not cut:
        kept = next((v for v in verdicts if not v.moved), None)
        raise NothingToMoveError(f"fit(): nothing in model {model.name!r} can move to the dataset"
                         + (f" (e.g. layer {kept.layer!r}: {kept.reason})" if kept else "")
                         + "; train it with model.fit as it is, on a dataset with .prefetch(tf.data.AUTOTUNE)",
                                 reason=f"layer {kept.layer!r}: {kept.reason}" if kept else "no layer can move")
    preprocessing = keras.Model(functional.input, cut, name=f"{model.name}_preprocessing")
    trainer = keras.Model(cut, functional.output, name=f"{model.name}_trainer")
    return KerasSplit(model=model, preprocessing=preprocessing, trainer=trainer, verdicts=tuple(verdicts),
                      cut=tuple(t.name for t in cut), deterministic=deterministic, analyses=analyses)


def verify_fit(model, dataset: tf.data.Dataset, *, steps: int = 20, split=None) -> StepCheck:
    """The Keras twin: `model.train_on_batch` on raw batches against the trainer on the mapped dataset, from
    the same weights and optimizer state (both put back after each run); compares each step's logs and
    then every weight. Both read the same first `steps` batches (same_batches).

        before:  model.fit(ds)                          after:  ss.tf2.fit(model, ds)
        check:   ss.tf2.verify_fit(model, ds, steps=20).identical
    """
    check_readable(dataset, "verify_fit")
    halves = split or split_model(model)
    compile_like(halves.trainer, model)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = list(model.variables) + list(model.optimizer.variables)
    snapshot = SavedValues(variables)

    def run(trainer, batches) -> Run:
        result = Run(fetches=["loss"])
        for batch in batches.take(steps):
            x, *rest = batch
            logs = trainer.train_on_batch(x, *rest, return_dict=True)
            result.values.append([np.asarray(logs["loss"])])
        result.ended = len(result.values) < steps
        result.variables = {f"{i}:{v.path}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        return result

    batches = same_batches(dataset, steps)
    try:
        before = run(model, batches)
        snapshot.restore()
        after = run(halves.trainer, halves.map(batches))
    finally:
        snapshot.restore()
    return StepCheck(compare_runs(before, after), halves)


__all__ = ["KerasSplit", "LayerVerdict", "compile_like", "graph_model", "split_model", "verify_fit"]
