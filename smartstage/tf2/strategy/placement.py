"""placement: where a Keras model's variables live, and what that decides for fit's split of it. One object
per placement, obtained once from the model, answers every question whose answer depends on the
tf.distribute strategy, so fit and the step route ask it instead of testing for a strategy at every turn.

    before:  strategy = model.distribute_strategy     # and `if strategy is not None` wherever it matters
    after:   placement = placement_of(model)          # OneDevice() or Distributed(strategy)
             placement.check_steps(model, tf_data_service);  placement.split_step(model, "train_step", ds, ...)

- OneDevice: the default strategy, one copy of every variable. The step is one `tf.function` of the model's
  step method, split by ss.tf2.split; the mapped dataset is the raw one through the prefetch side; fit's trial
  times the split.
- Distributed(strategy): the model was made under a strategy's scope. The layer route builds and splits it
  under that scope; the step route splits under MirroredStrategy only (check_steps), one replica's step at a
  time (smartstage.tf2.strategy.replicas), on the batches cut into per-replica slices; the trial does not run (it times
  copies of the model's variables, and a mirrored variable is not one copy); verify() cannot run the split
  (only Keras's loop runs the replicas).
"""

from __future__ import annotations

import abc
import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import tensorflow as tf

from smartstage.errors import SplitError
from smartstage.tf2.step.attributes import overridden
from smartstage.tf2.step.functions import mapped_dataset
from smartstage.tf2.step.split import SplitStep, split
from smartstage.tf2.strategy.replicas import distributing, per_replica_dataset, split_replicated, substituting


def step_function(model, method: str, autograph: bool):
    """A tf.function of the model class's own step method, as one device runs it; it holds the model weakly
    (the split cache holds it). Under a strategy the step is traced per replica instead (replicas.py).

        before:  model.train_step(batch)                       # Keras's loop calls the method
        after:   step_function(model, "train_step", autograph=False)(batch)
    """
    ref = weakref.ref(model)
    impl = getattr(type(model), method)

    def model_step(data):
        # Keras's loop hands the step a fresh structure each batch (next(iterator)), so a step may pop or add
        # keys (tfrs.Model.compute_loss pops its labels); a copy of the containers keeps that allowed here.
        return impl(ref(), tf.nest.map_structure(lambda tensor: tensor, data))

    model_step.__name__ = f"{type(model).__name__}_{method}"
    return tf.function(model_step, autograph=autograph)


class Placement(abc.ABC):
    """The questions fit asks where a model's variables live. The build and the map are the same around
    what each placement does differently (its scope, its slices of the batch)."""

    strategy: Any  # the strategy a split is cached for (keras.model_step compares it by identity); None for the default
    timed = True  # whether fit's trial may time a split of a model placed so (it runs on copies of the state)

    @abc.abstractmethod
    def check_steps(self, model, tf_data_service: str | None) -> None:
        """SplitError, before anything changes, when the step route does not split a model placed so."""

    @abc.abstractmethod
    def prepare_steps(self, model, dataset: tf.data.Dataset) -> None:
        """What the step route builds before the model's step is traced."""

    @abc.abstractmethod
    def split_step(self, model, method: str, dataset: tf.data.Dataset, *, autograph: bool,
                   deterministic: bool) -> SplitStep:
        """The model's `method` ("train_step" or "test_step") traced for `dataset` and split."""

    @abc.abstractmethod
    def run_fit(self, model, train, test, dataset: tf.data.Dataset, validation_data, callbacks,
                tf_data_service: str | None, fit_kwargs: dict):
        """The model's own fit on the splits `train` and `test` (ModelStepSplits; test may be None), while
        keras.model_step.replaced_steps has their main sides in place; the History."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What a split's summary says of the placement, after "split at op level"."""

    @abc.abstractmethod
    def check_verify(self, what: str) -> None:
        """SplitError when verify() cannot run a split made for this placement (`what`: model.method)."""

    def scope(self) -> contextlib.AbstractContextManager:
        """The context the model's objects were made in, for whatever fit makes beside them."""
        return contextlib.nullcontext()

    def build(self, model, dataset: tf.data.Dataset) -> None:
        """A Keras 3 model, its optimizer, loss and metrics built for the raw batches (under the scope), as
        model.fit would build them, before Keras sees the split's elements; SplitError when they do not build."""
        with self.scope():
            try:
                model._symbolic_build(data_batch=dataset.element_spec)
            except Exception as e:  # model.fit would fail on these batches too
                raise SplitError(f"fit(): model {model.name!r} does not build for the dataset's element_spec "
                                 f"{dataset.element_spec!r} ({type(e).__name__}: {str(e).strip().splitlines()[0]}); "
                                 "make the dataset yield what model.fit takes, (features, labels) or (features, "
                                 "labels, sample_weight), with every input the model has") from e

    def batches(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """The raw batches as one step receives them."""
        return dataset

    def map(self, dataset: tf.data.Dataset, halves: SplitStep, tf_data_service: str | None = None) -> tf.data.Dataset:
        """`dataset` (raw batches) as the split step of `halves` receives it: cut as one step receives it, mapped
        by the prefetch side, then prefetched."""
        return mapped_dataset(self.batches(dataset), halves.prefetch_function, deterministic=halves.deterministic,
                              tf_data_service=tf_data_service)


@dataclass(frozen=True)
class OneDevice(Placement):
    """The default strategy: one copy of every variable, the step one tf.function."""

    strategy = None

    def check_steps(self, model, tf_data_service: str | None) -> None:
        """The step route splits every model placed so."""

    def prepare_steps(self, model, dataset: tf.data.Dataset) -> None:
        """Nothing to build before the step is traced: the trace builds what is not built yet."""

    def split_step(self, model, method: str, dataset: tf.data.Dataset, *, autograph: bool,
                   deterministic: bool) -> SplitStep:
        """The model's `method` traced as one tf.function for `dataset` and split (ss.tf2.split)."""
        step = step_function(model, method, autograph=autograph)
        return split(step, dataset, deterministic=deterministic, state=[model], jit_compile=False)

    def run_fit(self, model, train, test, dataset: tf.data.Dataset, validation_data, callbacks,
                tf_data_service: str | None, fit_kwargs: dict):
        """model.fit on the mapped datasets (the split steps in place: keras.model_step.replaced_steps)."""
        return model.fit(train.map(dataset, tf_data_service), callbacks=callbacks,
                         validation_data=validation_data if test is None else test.map(validation_data),
                         **fit_kwargs)

    def describe(self) -> str:
        """What a summary adds about the placement: nothing."""
        return ""

    def check_verify(self, what: str) -> None:
        """verify() runs the split step on its own: it can."""


@dataclass(frozen=True)
class Distributed(Placement):
    """A tf.distribute strategy's scope: the variables are the strategy's (one copy per replica under
    MirroredStrategy), and Keras's loop runs the step on each replica's slice of the batch."""

    strategy: Any
    timed = False  # the trial times copies of the model's variables, and a mirrored variable is not one copy

    def scope(self) -> contextlib.AbstractContextManager:
        return self.strategy.scope()

    def check_steps(self, model, tf_data_service: str | None) -> None:
        """SplitError for a strategy the step route does not split: only MirroredStrategy (one worker) is,
        without a tf.data service."""
        name = type(self.strategy).__name__
        if not isinstance(self.strategy, tf.distribute.MirroredStrategy):
            raise SplitError(f"fit(): model {model.name!r} trains under {name}, and SmartStage splits "
                             "a distributed train step under tf.distribute.MirroredStrategy only; train it with "
                             "model.fit, or under MirroredStrategy")
        if tf_data_service is not None:
            raise SplitError(f"fit(): model {model.name!r} trains under {name}, whose replicas each "
                             "read their own slice of the batch, and a tf.data service job hands out whole batches; "
                             "drop tf_data_service=, or train without the strategy")

    def prepare_steps(self, model, dataset: tf.data.Dataset) -> None:
        """A Keras 3 model built for the raw batches before the step is traced per replica (run_fit keeps its
        fit from building it again from a distributed batch)."""
        if _builds_from_a_batch(model):
            self.build(model, dataset)

    def split_step(self, model, method: str, dataset: tf.data.Dataset, *, autograph: bool,
                   deterministic: bool) -> SplitStep:
        """The model's `method` traced for every replica at once and split per replica (replicas.py)."""
        return split_replicated(model, method, dataset, self.strategy, autograph=autograph,
                                deterministic=deterministic)

    def batches(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """The raw batches cut into per-replica slices, as tf.distribute cuts them (replicas.py)."""
        return per_replica_dataset(self.strategy, dataset)

    def run_fit(self, model, train, test, dataset: tf.data.Dataset, validation_data, callbacks,
                tf_data_service: str | None, fit_kwargs: dict):
        """model.fit on the raw datasets, whose distribution Keras is handed the mapped per-replica ones for;
        each replica's step is traced with the prefetched values (the split steps in place:
        keras.model_step.replaced_steps). A replica's trace that was refused raises its SplitError."""
        # Keras keeps the raw datasets (element spec, steps, an iterator per epoch) and distributes the mapped
        # per-replica ones in their place.
        mapped = {id(dataset): train.map(dataset)}
        if test is not None:
            mapped[id(validation_data)] = test.map(validation_data)
        try:
            with substituting(), distributing(self.strategy, mapped), self._built_from(model, dataset):
                return model.fit(dataset, callbacks=callbacks, validation_data=validation_data, **fit_kwargs)
        except Exception as e:
            # A replica's trace refused inside Keras's train function arrives rewrapped by autograph.
            for part in (train, test):
                if part is None:
                    continue
                refused, part.split.step.refused = part.split.step.refused, None
                if refused is not None:
                    raise refused from e
            raise

    @contextlib.contextmanager
    def _built_from(self, model, dataset: tf.data.Dataset) -> Iterator[None]:
        """For the duration, a Keras 3 model builds from the raw element spec (built already by
        prepare_steps), not from a first distributed batch: that batch is the boundary, averaged over the
        replicas."""
        if not _builds_from_a_batch(model):
            yield
            return

        def maybe_symbolic_build(iterator=None, data_batch=None):
            self.build(model, dataset)

        with overridden(model, _maybe_symbolic_build=maybe_symbolic_build):
            yield

    def describe(self) -> str:
        """Under which strategy, on how many replicas, the moved ops run."""
        return (f" under {type(self.strategy).__name__} ({self.strategy.num_replicas_in_sync} replicas; the moved "
                "ops of one replica's step, run on each replica's slice of the batch)")

    def check_verify(self, what: str) -> None:
        """SplitError: only Keras's loop runs the replicas of a split step."""
        raise SplitError(f"verify(): {what} is split for {type(self.strategy).__name__}, whose replicas only Keras's "
                         "loop runs; compare ss.tf2.fit with model.fit under the strategy instead (the History and "
                         "the weights)")


def _builds_from_a_batch(model) -> bool:
    """Whether the model's fit builds it from a first batch (a Keras 3 model: `_maybe_symbolic_build`); a
    tf_keras model builds on its first call."""
    return hasattr(model, "_maybe_symbolic_build")


ONE_DEVICE = OneDevice()


def placement_of(model) -> OneDevice | Distributed:
    """The placement of a Keras model: OneDevice under the default strategy, else Distributed(its strategy).

        before:  with strategy.scope(): model = build()
        after:   placement_of(model) == Distributed(strategy)
    """
    strategy = model.distribute_strategy
    if type(strategy).__name__ == "_DefaultDistributionStrategy":
        return ONE_DEVICE
    return Distributed(strategy)


__all__ = ["Distributed", "ONE_DEVICE", "OneDevice", "Placement", "placement_of", "step_function"]
