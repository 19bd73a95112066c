"""verify(): the split program against the original, step by step, from the same state (the Python twin of
`smartstage verify` for TF2 steps; verify_fit, its Keras twin, is in smartstage.tf2.keras.layers).

    check = ss.tf2.verify(train_step, ds, steps=20)
    check.identical      # every output of every step, then every variable, bit-identical
    check.describe()     # "identical: 20 step(s), 1 fetch(es) each, then 7 variable(s)" / "step 3: ... differs"

Both runs see the same batches in the same order: the first `steps` elements of the dataset are drawn once
and cached, and both programs read that cache (a dataset that shuffles, or draws random numbers, gives a
new order on each pass). Both runs start from the variables as they are (a snapshot), and the variables
are put back after each run: verify() trains nothing. Stateful random ops keep their own kernel state, which no snapshot reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from smartstage.inspection.replay import AFTER_LAST_STEP, Comparison, Mismatch, Run
from smartstage.tf2.step.user_state import SavedValues, iteration_changes


@dataclass(frozen=True)
class StepCheck:
    """The comparison of the original and the split program, and the split that ran."""

    comparison: Comparison
    split: Any  # the SplitStep, or the KerasSplit

    @property
    def identical(self) -> bool:
        return self.comparison.identical

    def describe(self) -> str:
        return self.comparison.describe()


def _values(output) -> list[np.ndarray]:
    return [np.asarray(t) for t in tf.nest.flatten(output)]


def _run(step, batches, steps: int, fetches: list[str], variables: list, unpack: bool) -> Run:
    run = Run(fetches=fetches)
    for batch in batches.take(steps):
        run.values.append(_values(step(*batch) if unpack else step(batch)))
    run.ended = len(run.values) < steps
    run.variables = {f"{i}:{v.name}": v.numpy() for i, v in enumerate(variables)}
    return run


def check_readable(dataset: tf.data.Dataset, caller: str) -> None:
    """SplitError when reading `dataset` would change what it yields to training afterwards (a shuffle that
    reshuffles each iteration, a generator, a function writing state): verify reads the batches it compares."""
    from smartstage.errors import SplitError

    why = iteration_changes(dataset)
    if why is not None:
        raise SplitError(f"{caller}(): {why}, so reading batches to compare would change what training reads "
                         f"next; pass {caller} a second dataset built the same way (or the same pipeline with "
                         "reshuffle_each_iteration=False)")


def same_batches(dataset: tf.data.Dataset, steps: int) -> tf.data.Dataset:
    """The first `steps` elements of `dataset`, drawn once: every pass over the result yields them again,
    in the same order, whatever the dataset's shuffle or random ops.

        before:  ds.shuffle(100)                       # each pass: a new order
        after:   same_batches(ds.shuffle(100), 20)      # each pass: the first pass's 20 batches
    """
    cached = dataset.take(steps).cache()
    for _ in cached:  # one full pass fills the cache: later passes read it, not the dataset
        pass
    return cached


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def compare_runs(before: Run, after: Run) -> Comparison:
    mismatches = []
    for step, (a_values, b_values) in enumerate(zip(before.values, after.values)):
        for fetch, a, b in zip(before.fetches, a_values, b_values):
            if not _same(a, b):
                mismatches.append(Mismatch(step, fetch, a, b))
    for name, a in before.variables.items():
        b = after.variables.get(name)
        if b is None or not _same(a, b):
            mismatches.append(Mismatch(AFTER_LAST_STEP, name, a, b))
    return Comparison(before, after, tuple(mismatches))


def verify(step, dataset: tf.data.Dataset, *, steps: int = 20, split=None, **split_kwargs) -> StepCheck:
    """Runs `step` on `dataset` and the split program on its dataset, `steps` batches each, from the same
    variable values, and compares every output and, after the last step, every variable the step captures.

        before:  for batch in ds.take(20): step(batch)         # and by hand, the split loop
        after:   ss.tf2.verify(step, ds, steps=20).describe()  # "identical: 20 step(s), ..."
    """
    from smartstage.tf2.step.functions import mapped_dataset
    from smartstage.tf2.step.split import split as split_step

    check_readable(dataset, "verify")
    halves = split or split_step(step, dataset, **split_kwargs)
    variables = list(halves.traced.variables)
    fetches = list(halves.traced.outputs)
    batches = same_batches(dataset, steps)
    mapped = mapped_dataset(batches, halves.prefetch_function, deterministic=True)  # in order, whatever the split's
    snapshot = SavedValues(variables)
    try:
        # the trace split() cut, not `step` itself: called on concrete batches, a tf.function traces for each
        # batch shape, which is another program (smartstage.tf2.step.trace.untouched_copy)
        before = _run(halves.traced.concrete, batches, steps, fetches, variables, halves.traced.unpack)
        snapshot.restore()
        after = _run(halves.step, mapped, steps, fetches, variables, unpack=False)
    finally:
        snapshot.restore()
    return StepCheck(compare_runs(before, after), halves)


__all__ = ["StepCheck", "check_readable", "compare_runs", "same_batches", "verify"]
