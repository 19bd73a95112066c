"""DeepRec model-zoo-style scripts (tests/compat/zoo) run on stock TensorFlow with only their import changed.

Each trains (MonitoredTrainingSession, checkpoints, summaries) and evaluates in a second session
(ChiefSessionCreator + MonitoredSession, the same DeepRec-style config and prefetch hook, the same
iterator re-initialised on the eval data). With do_smart_stage on, the losses of every step, the
eval ACC/AUC and the final checkpoint (bit for bit) must be those of the same script with the flag off,
the graph must be rewritten, and only once: the evaluation session reuses the training session's rewrite.
The multi-task script (esmm.py) runs whole, as `python esmm.py ...`: its stock-TensorFlow guard edited as
docs/porting-deeprec.md says, then main().
"""

from __future__ import annotations

import glob
import os

import pytest

import smartstage.optimizer
from smartstage.session.record import live_rewrite_of
from tests.compat.zoo_runner import (MODELS, assert_checkpoints_bitwise_equal, run_script, run_zoo, write_data,
                                     write_taobao_data)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return write_data(tmp_path_factory.mktemp("criteo"))


@pytest.fixture(scope="module")
def flag_off(data_dir, tmp_path_factory):
    """Per model: the staged script with do_smart_stage off, one prefetch thread (batches in input order)."""
    runs = {}

    def run(model):
        if model not in runs:
            runs[model] = run_zoo(model, data_dir, tmp_path_factory.mktemp(f"{model}_off"),
                                  ["--do_smart_stage", "False", "--stage_threads", "1"])
        return runs[model]

    return run


def _assert_trained_and_evaluated(run):
    assert len(run.losses) == 4 and all(loss > 0 for loss in run.losses)
    assert 0.0 <= run.auc <= 1.0 and 0.0 <= run.acc <= 1.0
    assert os.path.exists(os.path.join(run.checkpoint_dir, "checkpoint"))          # a checkpoint was written
    assert glob.glob(os.path.join(run.checkpoint_dir, "events.out.tfevents.*"))    # training summaries
    assert glob.glob(os.path.join(run.checkpoint_dir, "eval", "events.out.tfevents.*"))  # eval summaries


@pytest.fixture
def optimize_calls(monkeypatch) -> list:
    """Every optimize() call the sessions make (the live rewrite imports it from smartstage.optimizer when it runs)."""
    calls = []
    real = smartstage.optimizer.optimize

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(smartstage.optimizer, "optimize", counting)
    return calls


@pytest.mark.parametrize("model", MODELS)
def test_flag_on_one_thread_trains_and_evaluates_exactly_like_flag_off(model, data_dir, flag_off, tmp_path,
                                                                       optimize_calls):
    reference = flag_off(model)
    _assert_trained_and_evaluated(reference)
    off = live_rewrite_of(reference.graph)                           # flag off: nothing expands; the tf.data
    assert off is None or all(stage.folded_into for stage in off.stages)  # stage is folded into its dataset

    optimize_calls.clear()
    run = run_zoo(model, data_dir, tmp_path / "ckpt", ["--stage_threads", "1"])
    _assert_trained_and_evaluated(run)
    record = live_rewrite_of(run.graph)
    assert record is not None and record.changed                    # the flag took effect: ops moved
    assert any(stage.moved for stage in record.stages)
    # Two sessions (training, then evaluation) on one graph, one rewrite: the second found the first's record.
    assert optimize_calls == [run.graph] and record.result is not None
    assert run.losses == reference.losses
    assert (run.acc, run.auc) == (reference.acc, reference.auc)
    assert_checkpoints_bitwise_equal(run.checkpoint_dir, reference.checkpoint_dir)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_flag_on_four_threads_as_the_model_zoo_sets_it_matches_flag_off(model, data_dir, flag_off, tmp_path):
    # The model zoo's own setting: staged(next_element, num_threads=4, capacity=40).
    reference = flag_off(model)
    run = run_zoo(model, data_dir, tmp_path / "ckpt", ["--stage_threads", "4"])
    _assert_trained_and_evaluated(run)
    assert live_rewrite_of(run.graph).changed
    assert run.losses == reference.losses
    assert (run.acc, run.auc) == (reference.acc, reference.auc)
    assert_checkpoints_bitwise_equal(run.checkpoint_dir, reference.checkpoint_dir)


# -- the multi-task scripts: the stock-TensorFlow guard, edited as the docs say ----------------------------------

@pytest.fixture(scope="module")
def taobao_dir(tmp_path_factory) -> str:
    return write_taobao_data(tmp_path_factory.mktemp("taobao"))


def _esmm(taobao_dir, checkpoint_dir, *flags):
    return run_script("esmm", ["--data_location", taobao_dir, "--checkpoint_dir", checkpoint_dir,
                               "--optimizer", "adam", "--parquet_dataset", "False", "--batch_size", "32",
                               "--steps", "4", *flags])


@pytest.fixture(scope="module")
def esmm_flag_off(taobao_dir, tmp_path_factory):
    """The staged script with do_smart_stage off, and with no stage at all (--smartstaged False: stock TF's run)."""
    return {flags[0]: _esmm(taobao_dir, tmp_path_factory.mktemp("esmm_off"), *flags)
            for flags in (("--do_smart_stage", "False", "--stage_threads", "1"), ("--smartstaged", "False"))}


@pytest.mark.parametrize("threads", ["1", pytest.param("4", marks=pytest.mark.slow)])
def test_multi_task_script_with_the_edited_guard_runs_identical_flag_off_and_on(taobao_dir, esmm_flag_off, tmp_path,
                                                                                 threads, optimize_calls):
    unstaged, staged = esmm_flag_off["--smartstaged"], esmm_flag_off["--do_smart_stage"]
    for reference in (unstaged, staged):
        _assert_trained_and_evaluated(reference)
    assert staged.losses == unstaged.losses and (staged.acc, staged.auc) == (unstaged.acc, unstaged.auc)

    optimize_calls.clear()
    run = _esmm(taobao_dir, tmp_path / "ckpt", "--stage_threads", threads)  # --smartstaged True, the default
    _assert_trained_and_evaluated(run)
    assert live_rewrite_of(run.graph).changed and optimize_calls == [run.graph]
    for reference in (unstaged, staged):
        assert run.losses == reference.losses
        assert (run.acc, run.auc) == (reference.acc, reference.auc)
        assert_checkpoints_bitwise_equal(run.checkpoint_dir, reference.checkpoint_dir)


def test_the_edited_guard_still_refuses_what_stock_tensorflow_cannot_run(taobao_dir, tmp_path):
    # DeepRec's default optimizer, AdamAsyncOptimizer: the guard stops the script before it builds anything.
    with pytest.raises(ValueError, match="Stock Tensorflow does not support DeepRec features"):
        _esmm(taobao_dir, tmp_path, "--optimizer", "adamasync")
