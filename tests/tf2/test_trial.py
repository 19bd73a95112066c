"""The trial (smartstage.tf2.step.trial): a split is timed against the step it came from on copies of the step's
state, and fit() / split(measure=True) keep the faster program. Deciding changes no value: the user's
variables are untouched by the trial, and whichever program is kept trains as model.fit does.

    before:  ss.tf2.fit(model, ds)     # split whether or not the map pays for itself
    after:   ss.tf2.fit(model, ds)     # timed first; history.smartstage is a NotSplit when it does not pay

Which program wins depends on the machine, so the branches are forced through trial.PAYS_AT (a median
ratio can never reach infinity, and always reaches 0); the timing itself is real in every test.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from smartstage.errors import NothingToMoveError
from smartstage.tf2.keras import fit as keras_fit
from smartstage.tf2.keras.fit import NotSplit, StepFit
from smartstage.tf2.step import trial
from smartstage.tf2.step.split import split
from smartstage.tf2.step.trial import Verdict, time_split
from smartstage.tf2.step.user_state import iteration_changes, unchanged
from tests.tf2 import fit_models as fm
from tests.tf2.fit_support import assert_same_weights, batch_losses, identical  # noqa: F401

pytestmark = pytest.mark.usefixtures("eager", "identical")

NEVER, ALWAYS = float("inf"), 0.0
KEYS = ("user", "item")


@pytest.fixture
def quick_trial(monkeypatch):
    """Two rounds of a few steps: the decision logic, not the machine, is under test."""
    monkeypatch.setattr(trial, "ROUNDS", 2)
    monkeypatch.setattr(trial, "MAX_ROUNDS", 2)
    monkeypatch.setattr(trial, "ROUND_SECONDS", 0.02)


def _state(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in list(model.variables) + list(model.optimizer.variables)]


def test_verdict_is_the_median_of_the_round_ratios():
    verdict = Verdict(split_rates=(90.0, 120.0, 100.0), unsplit_rates=(100.0, 100.0, 100.0))
    assert verdict.ratios == (0.9, 1.2, 1.0)
    assert verdict.ratio == 1.0 and not verdict.pays  # a tie keeps the unmodified program: kept from 1.05x
    faster = Verdict(split_rates=(104.0, 110.0, 106.0), unsplit_rates=(100.0, 100.0, 100.0))
    assert faster.ratio == pytest.approx(1.06) and faster.pays
    assert not Verdict(split_rates=(104.0,), unsplit_rates=(100.0,)).pays
    slower = Verdict(split_rates=(80.0, 85.0, 95.0), unsplit_rates=(100.0, 100.0, 100.0))
    assert slower.ratio == 0.85 and not slower.pays
    assert slower.text().startswith("the split step ran 0.85x the unsplit one (median of 3 interleaved rounds, "
                                    "0.80-0.95;")


def _scripted_rates(monkeypatch, split_rate: float):
    """Every timed run of the split program reports `split_rate` steps/s, of the unsplit one 100."""
    last = []

    def run(program, iterator, steps):
        program.call(iterator)  # the step records which program this is
        return split_rate if last[-1] == "split" else 100.0

    monkeypatch.setattr(trial, "_run", run)
    return lambda name: (lambda element: last.append(name))


@pytest.mark.parametrize("split_rate, budget, rounds", [
    (103.0, 60.0, 9),   # 1.03x: within UNSURE of the 1.05 margin, so the rounds go on to MAX_ROUNDS
    (108.0, 60.0, 9),   # 1.08x: as near above the margin
    (150.0, 60.0, 3),   # clearly pays: ROUNDS rounds
    (80.0, 60.0, 3),    # clearly slower: ROUNDS rounds
    (103.0, 0.0, 3),    # near the margin, but the budget is spent: no round past MIN_ROUNDS
])
def test_a_median_near_the_keep_margin_is_decided_on_more_rounds(monkeypatch, split_rate, budget, rounds):
    monkeypatch.setattr(trial, "ROUNDS", 3)
    monkeypatch.setattr(trial, "MAX_ROUNDS", 9)
    monkeypatch.setattr(trial, "BUDGET_SECONDS", budget)
    step_of = _scripted_rates(monkeypatch, split_rate)
    dataset = tf.data.Dataset.range(4)
    verdict = trial.time_programs((step_of("split"), dataset), (step_of("unsplit"), dataset))
    assert len(verdict.ratios) == rounds
    assert verdict.ratio == pytest.approx(split_rate / 100.0)
    assert verdict.pays == (split_rate >= 105.0)


def test_a_step_that_cannot_be_copied_is_not_timed_and_keeps_its_split():
    verdict = Verdict(skipped="the step captures 'counts', a lookup table the step writes, which a trial cannot copy")
    assert verdict.ratio is None and verdict.pays
    assert verdict.text() == ("not timed (the step captures 'counts', a lookup table the step writes, which a trial "
                              "cannot copy)")


def _ids_step():
    weights = tf.Variable(tf.ones([64, 4]), name="weights")
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(batch):
        ids = tf.strings.to_hash_bucket_fast(batch["tag"], 64)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.gather(weights, ids))
        optimizer.apply_gradients([(tape.gradient(loss, weights), weights)])
        return loss

    tags = tf.constant([f"t{i % 7}" for i in range(64)])
    return step, weights, optimizer, tf.data.Dataset.from_tensor_slices({"tag": tags}).batch(8)


def test_time_split_leaves_the_step_state_as_it_was(quick_trial):
    step, weights, optimizer, dataset = _ids_step()
    halves = split(step, dataset)
    step(next(iter(dataset)))  # the optimizer's state exists, and is not at its initial value
    before = [weights.numpy().copy()] + [v.numpy().copy() for v in optimizer.variables]
    traces = step.experimental_get_tracing_count()
    verdict = time_split(halves, dataset)
    assert len(verdict.ratios) == 2 and all(r > 0 for r in verdict.ratios)
    after = [weights.numpy()] + [v.numpy() for v in optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert step.experimental_get_tracing_count() == traces  # the trial ran a fresh trace, not the user's


def test_the_custom_loop_trial_puts_the_user_state_back_when_a_round_fails(quick_trial, monkeypatch):
    step, weights, optimizer, dataset = _ids_step()
    halves = split(step, dataset)
    step(next(iter(dataset)))
    before = [weights.numpy().copy()] + [v.numpy().copy() for v in optimizer.variables]
    real_run, calls = trial._run, []

    def fails_late(program, iterator, steps):  # the unsplit program has trained the user's variables by then
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("a round failed")
        return real_run(program, iterator, steps)

    monkeypatch.setattr(trial, "_run", fails_late)
    verdict = time_split(halves, dataset)
    assert verdict.text() == "not timed (the trial failed: RuntimeError)"
    after = [weights.numpy()] + [v.numpy() for v in optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_split_measure_raises_when_the_split_does_not_pay(quick_trial, monkeypatch):
    step, _, _, dataset = _ids_step()
    monkeypatch.setattr(trial, "PAYS_AT", NEVER)
    with pytest.raises(NothingToMoveError, match=r"^split\(\): splitting 'step' does not pay: the split step ran "
                                                 r"[0-9.]+x the unsplit one .*iterate the dataset with "
                                                 r"\.prefetch\(tf\.data\.AUTOTUNE\)") as raised:
        split(step, dataset, measure=True)
    assert raised.value.reason.startswith("measured: the split step ran")


def test_split_measure_keeps_a_split_that_pays_and_says_so(quick_trial, monkeypatch):
    step, _, _, dataset = _ids_step()
    monkeypatch.setattr(trial, "PAYS_AT", ALWAYS)
    halves = split(step, dataset, measure=True)
    assert halves.trial is not None and len(halves.trial.ratios) == 2
    assert "timed: the split step ran" in halves.summary()


def test_a_step_writing_a_table_is_not_timed(quick_trial):
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1, name="seen")
    weights = tf.Variable(tf.ones([64]))

    @tf.function
    def step(batch):
        ids = tf.strings.to_hash_bucket_fast(batch["tag"], 64)
        table.insert(batch["tag"], ids)
        return tf.reduce_sum(tf.gather(weights, ids)) + tf.cast(tf.reduce_sum(table.lookup(batch["tag"])), tf.float32)

    dataset = tf.data.Dataset.from_tensor_slices({"tag": tf.constant(["a", "b"] * 8)}).batch(4)
    verdict = time_split(split(step, dataset, state=[table]), dataset)
    assert verdict.ratio is None and verdict.pays
    assert verdict.skipped.startswith("the step captures ") and "which a trial cannot copy" in verdict.skipped


def test_a_dataset_reading_a_python_generator_is_not_timed(quick_trial):
    step, _, _, dataset = _ids_step()
    tags = iter([f"t{i % 7}" for i in range(64)])  # one generator object: each tag can be read once

    def each_tag_once():
        for tag in tags:
            yield {"tag": tag}

    once = tf.data.Dataset.from_generator(each_tag_once, output_signature={"tag": tf.TensorSpec([], tf.string)})
    verdict = time_split(split(step, dataset), once.batch(8))
    assert verdict.pays and verdict.text() == ("not timed (the dataset reads through GeneratorDataset, whose source "
                                               "a trial's iterators would consume)")
    assert len(list(tags)) == 64  # the trial took nothing from the user's generator
    assert iteration_changes(dataset) is None and iteration_changes(dataset.map(lambda b: b).batch(2)) is None


def test_an_empty_dataset_is_not_timed(quick_trial):
    step, _, _, dataset = _ids_step()
    verdict = time_split(split(step, dataset), dataset.take(0))
    assert verdict.pays and verdict.text() == "not timed (the dataset yields no batch)"


def test_a_failing_trial_keeps_the_split_and_says_so(quick_trial, monkeypatch, caplog):
    from smartstage.tf2.step import functions

    step, _, _, dataset = _ids_step()
    halves = split(step, dataset)

    def broken(*args, **kwargs):
        raise RuntimeError("cannot import")

    monkeypatch.setattr(functions, "main_function", broken)
    verdict = time_split(halves, dataset)
    assert verdict.pays and verdict.text() == "not timed (the trial failed: RuntimeError)"
    assert "the trial failed, the split is kept: RuntimeError: cannot import" in caplog.text


@pytest.mark.parametrize("factory", [fm.ranking_tf_keras, fm.keras3_subclassed, fm.keras3_feature_space],
                         ids=["tf_keras_steps", "keras3_steps", "keras3_layers"])
@pytest.mark.parametrize("pays", [True, False], ids=["pays", "slower"])
def test_fit_trains_as_model_fit_whichever_program_it_keeps(factory, pays, quick_trial, monkeypatch):
    keys = ("user", "item", "age") if factory is not fm.ranking_tf_keras else KEYS
    monkeypatch.setattr(trial, "PAYS_AT", ALWAYS if pays else NEVER)
    reference = factory()
    expected = batch_losses(reference)
    reference.fit(fm.dataset(keys), epochs=2, callbacks=[expected], verbose=0)
    model = factory()
    got = batch_losses(model)
    history = keras_fit.fit(model, fm.dataset(keys), epochs=2, callbacks=[got], verbose=0)

    assert got.losses == expected.losses and len(got.losses) > 0
    assert history.history == reference.history.history
    assert_same_weights(reference, model)
    if pays:
        assert not isinstance(history.smartstage, NotSplit)
        kept = history.smartstage.train if isinstance(history.smartstage, StepFit) else history.smartstage
        assert len(kept.trials["train_step"].ratios) == 2
    else:
        assert isinstance(history.smartstage, NotSplit)
        assert history.smartstage.reason.startswith("measured: the split step ran")
        assert history.smartstage.summary().endswith("trained with model.fit as it is")
    assert len(_state(model)) == len(_state(reference))  # the trial's copies are no variables of the model


def test_fit_times_a_split_once(quick_trial, monkeypatch):
    calls = []
    real = keras_fit.time_split
    monkeypatch.setattr(keras_fit, "time_split", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(trial, "PAYS_AT", ALWAYS)
    model = fm.ranking_tf_keras()
    first = keras_fit.fit(model, fm.dataset(KEYS), epochs=1, verbose=0).smartstage.train
    again = keras_fit.fit(model, fm.dataset(KEYS, seed=3), epochs=1, verbose=0).smartstage.train
    assert again is first and len(calls) == 1


def test_fit_with_measure_false_splits_without_timing(monkeypatch):
    monkeypatch.setattr(keras_fit, "time_split", lambda *a, **k: pytest.fail("timed with measure=False"))
    history = keras_fit.fit(fm.ranking_tf_keras(), fm.dataset(KEYS), epochs=1, verbose=0, measure=False)
    assert isinstance(history.smartstage, StepFit) and history.smartstage.train.trials == {}


def test_the_trial_runs_as_many_steps_per_call_as_the_model_executes(quick_trial):
    #   a step counting its runs; timed in one tf.function 4 steps per call, as fit with steps_per_execution=4
    runs = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(batch):
        runs.assign_add(1)
        return tf.reduce_sum(batch)

    dataset = tf.data.Dataset.range(64).batch(4)
    verdict = trial.time_programs((step, dataset), (step, dataset), in_function=True, steps_per_call=4)
    assert verdict.steps_per_call == 4 and len(verdict.ratios) == 2
    assert runs.numpy() % 4 == 0 and runs.numpy() >= 2 * 2 * 4  # whole calls of 4 steps, both programs
    assert "4 steps per call" in verdict.text()
    one = trial.time_programs((step, dataset), (step, dataset), in_function=False, steps_per_call=4)
    assert one.steps_per_call == 1  # a custom loop calls the step once per element


def test_fit_times_the_model_as_compiled_with_steps_per_execution(quick_trial, monkeypatch):
    seen = []
    real = keras_fit.time_split
    monkeypatch.setattr(keras_fit, "time_split", lambda *a, **k: seen.append(k["steps_per_call"]) or real(*a, **k))
    monkeypatch.setattr(trial, "PAYS_AT", ALWAYS)
    model, reference = fm.ctr_tf_keras(steps_per_execution=2), fm.ctr_tf_keras(steps_per_execution=2)
    history = keras_fit.fit(model, fm.dataset(samples=52), epochs=1, verbose=0)
    expected = reference.fit(fm.dataset(samples=52), epochs=1, verbose=0)
    assert seen == [2] and history.smartstage.train.trials["train_step"].steps_per_call == 2
    assert history.history["loss"] == expected.history["loss"]
    assert_same_weights(model, reference)


def test_the_logged_verdict_states_the_trials_wall_time(quick_trial, caplog):
    step, _, _, dataset = _ids_step()
    with caplog.at_level("INFO", logger="smartstage.tf2.step.trial"):
        verdict = trial.time_programs((step, dataset), (step, dataset))
    assert verdict.seconds > 0.1  # the warm-up alone runs 0.5 s
    assert f"the trial took {verdict.seconds:.1f} s" in caplog.text


def _random_program(reshuffle: bool = False):
    """A custom-loop step with every kind of random state a step may draw from: a Keras Dropout (its
    SeedGenerator), a tf.random.Generator, and an op-seeded stateful op under the global seed; with
    `reshuffle`, on a dataset that reshuffles each iteration (Dataset.shuffle's default)."""
    tf.random.set_seed(3)
    weights = tf.Variable(tf.ones([64, 4]), name="weights")
    generator = tf.random.Generator.from_seed(5)
    dropout = tf.keras.layers.Dropout(0.3, seed=11)
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(batch):
        ids = tf.strings.to_hash_bucket_fast(batch["tag"], 64)
        with tf.GradientTape() as tape:
            hidden = dropout(tf.gather(weights, ids), training=True)
            noise = generator.normal(tf.shape(hidden)) * 0.01 + tf.random.uniform(tf.shape(hidden), maxval=0.01)
            loss = tf.reduce_mean(hidden + noise)
        optimizer.apply_gradients([(tape.gradient(loss, weights), weights)])
        return loss

    tags = tf.data.Dataset.from_tensor_slices({"tag": tf.constant([f"t{i % 7}" for i in range(64)])})
    dataset = (tags.shuffle(64, seed=1) if reshuffle else tags).batch(8).repeat(3)
    return step, dataset, lambda: [weights.numpy(), generator.state.numpy()] + [v.numpy() for v in
                                                                                  optimizer.variables]


@pytest.mark.parametrize("pays", [True, False], ids=["kept_split", "kept_unsplit"])
def test_a_custom_loop_timed_by_the_trial_trains_as_the_unsplit_loop(pays, quick_trial, monkeypatch):
    step, dataset, values = _random_program()
    expected = [float(step(batch)) for batch in dataset]
    expected_values = values()

    monkeypatch.setattr(trial, "PAYS_AT", ALWAYS if pays else NEVER)
    step, dataset, values = _random_program()
    before = values()
    with unchanged("deciding the split", datasets=(dataset,)):  # no global generator or seed moved
        try:
            halves = split(step, dataset, measure=True)
            loop = (halves.step, halves.dataset)
        except NothingToMoveError:
            loop = (step, dataset)
    assert all(np.array_equal(a, b) for a, b in zip(before, values()))  # deciding trained nothing
    assert (loop[0] is step) != pays
    assert [float(loop[0](batch)) for batch in loop[1]] == expected  # bit-identical, step by step
    assert all(np.array_equal(a, b) for a, b in zip(expected_values, values()))


def test_a_custom_loop_on_a_reshuffling_dataset_is_split_untimed_and_trains_as_the_unsplit_loop(quick_trial):
    step, dataset, values = _random_program(reshuffle=True)
    expected = [float(step(batch)) for batch in dataset]
    expected_values = values()

    step, dataset, values = _random_program(reshuffle=True)
    before = values()
    with unchanged("deciding the split", datasets=(dataset,)):  # no generator moved, no iterator of `dataset`
        halves = split(step, dataset, measure=True)
    assert all(np.array_equal(a, b) for a, b in zip(before, values()))
    assert halves.trial.ratio is None and "reshuffles each iteration" in halves.trial.skipped
    assert [float(halves.step(batch)) for batch in halves.dataset] == expected  # the same batch order
    assert all(np.array_equal(a, b) for a, b in zip(expected_values, values()))
