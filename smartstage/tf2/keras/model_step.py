"""model_step: a Keras model's own train (or test) step split at op level by the engine of ss.tf2.split, and
fit() run by the model's own loop on the mapped dataset.

    before:  model.fit(ds, validation_data=val)            # model.train_step(raw batch) does the preprocessing
    after:   with replaced_steps(model, train, test):       # train = split_model_step(model, "train_step", ds)
                 model.fit(train.map(ds), validation_data=test.map(val))

Any Keras model that fit() trains is covered, whatever builds its graph: Keras 3 or tf_keras, functional,
Sequential or subclassed, with the stock or an overridden train_step. The step is traced for the dataset's
element spec (`tf.function(type(model).train_step)`), partitioned like any TF2 step (smartstage.tf2.step.split),
and the moved part becomes a deterministic `dataset.map` + prefetch. During the call the model's
`train_step`/`test_step` are instance attributes that run the main side, and its `train_function`/
`test_function` are cleared so Keras builds them around the main side: callbacks, compiled losses and
metrics, `steps_per_execution`, validation and History are Keras's own, on the user's model. Afterwards both
are what they were, on error too: `model.fit` trains the model through its own train function again.

A split is cached per model and step, keyed on the element spec, the model's variables (which, their
shapes, which train), its compile state (the loss, metrics and optimizer objects compile() made) and its
jit setting; any change re-splits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import tensorflow as tf

from smartstage.errors import SplitError
from smartstage.tf2.step.attributes import overridden
from smartstage.tf2.step.split import SplitStep
from smartstage.tf2.strategy.placement import ONE_DEVICE, Placement

logger = logging.getLogger(__name__)

TRAIN_STEP, TEST_STEP = "train_step", "test_step"
# The attributes a Keras loop builds from the step methods (tf_keras also keeps the tf.function it wraps).
_FUNCTIONS = {TRAIN_STEP: ("train_function", "train_tf_function"), TEST_STEP: ("test_function", "test_tf_function")}

_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def keras_family(model) -> str:
    """"keras" (Keras 3) or "tf_keras" (Keras 2); SplitError for anything else.

        before:  isinstance(model, keras.Model) or isinstance(model, tf_keras.Model)
        after:   keras_family(model) -> "keras" | "tf_keras"
    """
    try:
        import keras

        if isinstance(model, keras.Model):
            return "keras"
    except ImportError:  # pragma: no cover - Keras 3 ships with TensorFlow 2.16+
        pass
    try:
        import tf_keras

        if isinstance(model, tf_keras.Model):
            return "tf_keras"
    except ImportError:
        pass
    raise SplitError(f"fit(): {type(model).__name__} is not a Keras model; pass a keras.Model or tf_keras.Model, "
                     "or split a custom training step with ss.tf2.split(step, dataset)")


def steps_per_execution(model) -> int:
    """How many steps the model's fit runs per call of its train function (compile's steps_per_execution; 1
    when unset). Keras 3 keeps it as an int attribute, tf_keras in a variable.

        before:  model.compile("adam", "mse", steps_per_execution=4)
        after:   steps_per_execution(model) == 4
    """
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)
    if hasattr(value, "numpy"):
        value = value.numpy()
    try:
        return max(1, int(value))
    except (TypeError, ValueError):  # not compiled yet, or a setting Keras resolves later ("auto")
        return 1


def is_compiled(model) -> bool:
    """Whether compile() ran with an optimizer, in either Keras.

        before:  model.compiled (Keras 3) / model._is_compiled (tf_keras)
        after:   is_compiled(model)
    """
    if keras_family(model) == "keras":
        return bool(getattr(model, "compiled", False)) and getattr(model, "optimizer", None) is not None
    return bool(getattr(model, "_is_compiled", False)) and getattr(model, "optimizer", None) is not None


def compile_identity(model) -> tuple:
    """The objects compile() made, by identity: a new compile() makes new ones.

        before:  model.compile(...); a = compile_identity(model)
        after:   model.compile(...); compile_identity(model) != a
    """
    return tuple(id(p) for p in _compile_objects(model)) + (getattr(model, "_jit_compile", None),
                                                            bool(model.run_eagerly))


def _compile_objects(model) -> tuple:
    """The optimizer, loss and metric containers compile() made (none of them refers back to the model)."""
    if keras_family(model) == "keras":
        return (model.optimizer, getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None),
                getattr(model, "_loss_tracker", None))
    return (model.optimizer, getattr(model, "compiled_loss", None), getattr(model, "compiled_metrics", None))


def _weight_key(weight) -> tuple:
    """A variable by identity, shape, dtype and whether it trains. Keras also tracks weights that are no
    variables (tf_keras's VocabWeightHandler, which saves an adapted lookup layer's vocabulary): those by
    identity and the table they stand for, so a new vocabulary (set_weights) is a new key."""
    if hasattr(weight, "shape"):
        return (id(weight), tuple(weight.shape), str(weight.dtype), bool(weight.trainable))
    table = getattr(getattr(weight, "_layer", None), "lookup_table", None)
    return (id(weight), type(weight).__name__, id(table))


def model_key(model, element_spec) -> tuple:
    """What a split depends on: the element spec, every variable (identity, shape, dtype, trains or not) and
    the compile state (the cache keeps the compile objects alive, so their ids name no other object).

        before:  key = model_key(model, ds.element_spec)
        after:   model.layers[-1].trainable = False;  model_key(model, ds.element_spec) != key
    """
    variables = tuple(_weight_key(v) for v in model.variables)
    trainable = tuple(id(v) for v in model.trainable_variables)
    return (repr(element_spec), variables, trainable, compile_identity(model))


@dataclass(frozen=True)
class ModelStepSplit:
    """One step method of a model, split: `map(dataset)` runs the prefetch side in the dataset, `step(element)`
    runs the main side on the model's variables and returns what the step returned."""

    model_name: str
    method: str  # TRAIN_STEP or TEST_STEP
    split: SplitStep
    key: tuple = field(repr=False)
    keep_alive: tuple = field(default=(), repr=False)  # the compile objects the key names by identity
    placement: Placement = field(default=ONE_DEVICE, repr=False)  # where the model's variables live (placement.py)
    trials: dict = field(default_factory=dict, repr=False, compare=False)  # fit()'s timed Verdict, kept with the split
    functions: dict = field(default_factory=dict, repr=False, compare=False)  # what Keras built around the main side

    def map(self, dataset: tf.data.Dataset, tf_data_service: str | None = None) -> tf.data.Dataset:
        """`dataset` (raw batches with this split's element spec) mapped by the prefetch side, then prefetched;
        under a strategy, its per-replica slices are (smartstage.tf2.strategy.replicas)."""
        return self.placement.map(dataset, self.split, tf_data_service)

    def step(self, element):
        """The main side on one mapped element (the boundary tensors)."""
        return self.split.step(element)

    def summary(self) -> str:
        timed = [f"timed: {v.text()}" for v in self.trials.values()]
        return "\n".join([f"Keras model {self.model_name!r}, {self.method} split at op level"
                          f"{self.placement.describe()}:",
                          self.split.summary()] + timed)

    def explain(self, node: str):
        """Why `node` of the step's graph moved or stayed (an Explanation; .text() for the sentence)."""
        return self.split.explain(node)

    def verify(self, dataset: tf.data.Dataset, *, steps: int = 20):
        """The model's own step on `dataset` against the split step on its mapped batches, from the same
        variable values, put back afterwards (smartstage.tf2.step.compare.verify): trains nothing.

            before:  history = ss.tf2.fit(model, ds)
            after:   history.smartstage.train.verify(ds, steps=10).identical
        """
        from smartstage.tf2.step.compare import verify

        self.placement.check_verify(f"{self.model_name}.{self.method}")
        return verify(self.split.traced.function, dataset, steps=steps,
                      split=dataclasses.replace(self.split, dataset=self.map(dataset)))


def _innermost(error: Exception) -> str:
    """The innermost "SomeError: message" line of a tracing error (autograph wraps the user's error in
    its own), or the error's type and first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Z]\w*(Error|Exception): ", line)]
    return named[-1] if named else f"{type(error).__name__}: {lines[0] if lines else ''}"


def split_model_step(model, method: str, dataset: tf.data.Dataset, *, deterministic: bool = True,
                     placement: Placement = ONE_DEVICE) -> ModelStepSplit:
    """The model's `method` ("train_step" or "test_step") traced for `dataset` and split, or the cached split
    when nothing it depends on changed (model_key). `placement` (placement.placement_of(model)) traces and
    splits it: one tf.function, or per replica under a MirroredStrategy (smartstage.tf2.strategy.replicas).

        before:  model.train_step(raw_batch)
        after:   s = split_model_step(model, "train_step", ds);  s.step(element) for element in s.map(ds)
    """
    cached = _CACHE.get(model, {}).get(method)
    if cached is not None and cached.key == model_key(model, dataset.element_spec) \
            and cached.split.deterministic == deterministic and cached.placement.strategy is placement.strategy:
        logger.info("%s.%s: split reused", model.name, method)
        return cached
    family = keras_family(model)
    try:
        # Keras 3 traces its step without autograph (do_not_convert), tf_keras with it: trace as each does.
        halves = placement.split_step(model, method, dataset, autograph=family == "tf_keras",
                                      deterministic=deterministic)
    except SplitError:
        raise
    except Exception as e:  # the model's own step does not trace for these batches: model.fit would fail too
        raise SplitError(f"fit(): {model.name}.{method} does not trace for the dataset's element_spec "
                         f"{dataset.element_spec!r} ({_innermost(e)}); make the dataset yield what "
                         f"model.fit takes, (features, labels) or (features, labels, sample_weight), with every "
                         "feature the model reads") from e
    # Keyed after the split: its trace builds the variables of a model not built yet.
    result = ModelStepSplit(model_name=model.name, method=method, split=halves,
                            key=model_key(model, dataset.element_spec),
                            keep_alive=_compile_objects(model), placement=placement)
    _CACHE.setdefault(model, {})[method] = result
    return result


@contextlib.contextmanager
def replaced_steps(model, splits: dict[str, ModelStepSplit]) -> Iterator[None]:
    """For the duration: each split's step method is the main side, and the functions Keras builds from it
    are the ones it built around that main side in an earlier call (kept with the split), or cleared, so the
    model's own loop builds them; afterwards every attribute is what it was (also on error). Keeping them
    spares each fit() call a new trace of the train function, as Keras spares model.fit's calls.

        before:  model.fit(ds)                      # model.train_function(iterator) -> model.train_step(batch)
        after:   with replaced_steps(model, {"train_step": s}): model.fit(s.map(ds))
    """
    attributes = {method: part.step for method, part in splits.items()}
    attributes.update((name, part.functions.get(name)) for method, part in splits.items()
                      for name in _FUNCTIONS[method])
    with overridden(model, **attributes):
        try:
            yield
        finally:
            for method, part in splits.items():
                part.functions.update((name, model.__dict__.get(name)) for name in _FUNCTIONS[method])


__all__ = ["ModelStepSplit", "TEST_STEP", "TRAIN_STEP", "compile_identity", "is_compiled", "keras_family",
           "steps_per_execution", "model_key", "replaced_steps", "split_model_step"]
