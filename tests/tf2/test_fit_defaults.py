"""Values first at the defaults: `keras_fit.fit` (ss.tf2.fit with nothing beyond model.fit's arguments, the timed
trial on) trains exactly what model.fit trains, on datasets that reshuffle each iteration and models with
random layers, with the trial's verdict forced either way and left to the timing; and the state check
(SMARTSTAGE_CHECK_STATE=1, on for every test here) finds nothing deciding changed.

    before:  model.fit(ds, epochs=2)                      # per-step losses L, weights W
    after:   keras_fit.fit(model, ds, epochs=2)           # the same L and W, bit for bit, whichever program it keeps
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from smartstage.errors import SplitError, StateChangedError
from smartstage.tf2.keras import fit as keras_fit
from smartstage.tf2.keras.fit import NotSplit, StepFit
from smartstage.tf2.step import trial
from smartstage.tf2.step.user_state import CHECK_STATE_ENV, iteration_changes, snapshot, unchanged
from tests.tf2 import random_models as rm
from tests.tf2.fit_support import assert_same_weights, batch_losses, identical  # noqa: F401

pytestmark = pytest.mark.usefixtures("eager", "identical")

VERDICTS = {"pays": 0.0, "slower": float("inf"), "timed": None}


@pytest.fixture(autouse=True)
def quick_checked_trial(monkeypatch):
    """A short trial (the timing is real, the machine decides) and the state check on."""
    monkeypatch.setattr(trial, "ROUNDS", 2)
    monkeypatch.setattr(trial, "ROUND_SECONDS", 0.02)
    monkeypatch.setenv(CHECK_STATE_ENV, "1")


def _fit_both(name: str, verdict: str, monkeypatch, dataset_of=None, reshuffle: bool = True):
    factory, data = rm.MODELS[name]
    data = dataset_of or (lambda: rm.MODELS[name][1](reshuffle=reshuffle))
    if VERDICTS[verdict] is not None:
        monkeypatch.setattr(trial, "PAYS_AT", VERDICTS[verdict])
    reference = factory()
    expected = batch_losses(reference)
    reference.fit(data(), epochs=2, callbacks=[expected], verbose=0)
    model = factory()
    got = batch_losses(model)
    history = keras_fit.fit(model, data(), epochs=2, callbacks=[got], verbose=0)
    return reference, expected, model, got, history


# A reshuffling dataset is never timed, so a forced verdict changes nothing there: it runs at the defaults only.
CASES = [("timed", True)] + [(verdict, False) for verdict in VERDICTS]


@pytest.mark.parametrize("verdict,reshuffle", CASES,
                         ids=[f"{v}-{'reshuffled' if r else 'fixed_order'}" for v, r in CASES])
@pytest.mark.parametrize("name", list(rm.MODELS))
def test_fit_at_its_defaults_trains_what_model_fit_trains(name, verdict, reshuffle, monkeypatch):
    reference, expected, model, got, history = _fit_both(name, verdict, monkeypatch, reshuffle=reshuffle)

    assert len(got.losses) == 12 and got.losses == expected.losses
    assert history.history == reference.history.history
    assert_same_weights(reference, model)
    evaluation = rm.unshuffled(name)
    assert model.evaluate(evaluation, verbose=0) == reference.evaluate(evaluation, verbose=0)
    np.testing.assert_array_equal(rm.predictions(model, evaluation), rm.predictions(reference, evaluation))
    result = history.smartstage
    if reshuffle:  # never timed: a trial's iterator would advance the shuffle's seed
        trials = (result.train if isinstance(result, StepFit) else result).trials
        assert [v.skipped.split(" (")[0] for v in trials.values()] == ["the dataset reshuffles each iteration"]
    elif verdict != "timed":  # timed, and the forced verdict kept
        assert isinstance(result, NotSplit) == (verdict == "slower")


@pytest.mark.parametrize("name", ["keras3_functional", "tf_keras_functional"])
def test_fit_on_make_csv_dataset_at_its_defaults_trains_what_model_fit_trains(name, monkeypatch, tmp_path):
    reference, expected, model, got, history = _fit_both(name, "timed", monkeypatch,
                                                         dataset_of=lambda: rm.csv_dataset(tmp_path / "rows.csv"))
    assert len(got.losses) == 12 and got.losses == expected.losses
    assert_same_weights(reference, model)


def test_history_smartstage_goes_back_into_fit(monkeypatch):
    """Whatever fit puts in history.smartstage, split= takes back, and training stays identical. Each model
    trains both calls before the other is built (tf_keras's random ops draw from per-process seeds that
    building a model resets)."""
    monkeypatch.setattr(trial, "PAYS_AT", 0.0)
    factory, data = rm.MODELS["tf_keras_functional"]
    reference = factory()
    reference.fit(data(), epochs=2, verbose=0)
    expected = batch_losses(reference)
    reference.fit(data(), epochs=1, callbacks=[expected], verbose=0)
    model = factory()
    history = keras_fit.fit(model, data(), epochs=2, verbose=0)
    got = batch_losses(model)
    second = keras_fit.fit(model, data(), epochs=1, callbacks=[got], verbose=0, split=history.smartstage)
    assert isinstance(history.smartstage, StepFit) and second.smartstage.train is history.smartstage.train
    assert len(got.losses) == 6 and got.losses == expected.losses
    assert_same_weights(reference, model)
    with pytest.raises(SplitError, match="split= takes what history.smartstage held"):
        keras_fit.fit(model, data(), split="last time")


def test_a_reshuffling_dataset_is_named_and_a_fixed_one_is_not():
    base = tf.data.Dataset.range(16)
    assert iteration_changes(base.shuffle(16, seed=1).batch(4)).startswith("the dataset reshuffles each iteration")
    assert iteration_changes(base.shuffle(16, seed=1, reshuffle_each_iteration=False).batch(4)) is None
    assert iteration_changes(tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True).take(4)) is not None
    generator = tf.random.Generator.from_seed(1)
    assert "writes state" in iteration_changes(base.map(lambda i: i + tf.cast(generator.uniform([]) * 0, tf.int64)))
    assert iteration_changes(base.interleave(lambda i: tf.data.Dataset.range(i).shuffle(4, seed=2))) is not None


def test_the_state_check_names_what_changed():
    """The check is real: a block that advances a seed or writes a variable, or iterates a reshuffling dataset,
    is named."""
    variable = tf.Variable(1.0)

    class Holder:
        variables = [variable]

    with pytest.raises(StateChangedError, match="numpy random"):
        with unchanged("the block"):
            np.random.uniform()
    with pytest.raises(StateChangedError, match="variable"):
        with unchanged("the block", Holder()):
            variable.assign_add(1.0)
    dataset = tf.data.Dataset.range(8).shuffle(8, seed=3)
    with pytest.raises(StateChangedError, match="1 iterator"):
        with unchanged("the block", datasets=(dataset,)):
            next(iter(dataset.batch(2)))
    before = snapshot(Holder())
    assert before.differences(snapshot(Holder())) == []


def test_building_the_model_may_draw_what_its_initializers_draw():
    """A model that deciding builds (its step's trace creates its variables, as model.fit's own trace would)
    draws its initializers' seeds from the global generators: excused then, and only then."""
    class Growing:
        variables: list = []

    import random

    with unchanged("building", Growing()):
        Growing.variables.append(tf.Variable(random.random()))
    with pytest.raises(StateChangedError, match="python random"):
        with unchanged("not building", Growing()):
            random.random()


@pytest.mark.parametrize("verdict", ["pays", "slower"])
def test_a_run_eagerly_model_is_timed_as_fit_runs_it(verdict, monkeypatch):
    """The trial times the program fit will run: eager steps for a model compiled with run_eagerly=True (traced
    steps would time another program); the model's state is put back, and training matches model.fit."""
    monkeypatch.setattr(trial, "PAYS_AT", VERDICTS[verdict])
    reference = rm.keras3_eager()
    expected = batch_losses(reference)
    reference.fit(rm.shuffled(reshuffle=False), epochs=2, callbacks=[expected], verbose=0)
    model = rm.keras3_eager()
    got = batch_losses(model)
    history = keras_fit.fit(model, rm.shuffled(reshuffle=False), epochs=2, callbacks=[got], verbose=0)
    calls = rm.EagerRecorder.calls
    assert len(calls) > 12 and all(calls)  # fit's 12 training calls and the trial's, every one eager
    result = history.smartstage
    if verdict == "pays":
        assert result.trials["train_step"].ratio is not None and result.trials["train_step"].seconds > 0
    else:
        assert isinstance(result, NotSplit) and result.reason.startswith("measured: the split step ran")
    assert got.losses == expected.losses
    assert_same_weights(reference, model)
