"""DeepRec model-zoo-style scripts (tests/compat/zoo) run on stock TensorFlow with only their import changed.

Each trains (MonitoredTrainingSession, checkpoints, summaries) and evaluates in a second session
(ChiefSessionCreator + MonitoredSession, the same DeepRec-style config and prefetch hook, the same
iterator re-initialised on the eval data). With do_smart_stage on, the losses of every step and the
eval ACC/AUC must be those of the same script with the flag off, and the graph must be rewritten.
"""

from __future__ import annotations

import glob
import os

import pytest

from smartstage.session.record import live_rewrite_of
from tests.compat.zoo_runner import MODELS, run_zoo, write_data


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


@pytest.mark.parametrize("model", MODELS)
def test_flag_on_one_thread_trains_and_evaluates_exactly_like_flag_off(model, data_dir, flag_off, tmp_path):
    reference = flag_off(model)
    _assert_trained_and_evaluated(reference)
    assert live_rewrite_of(reference.graph) is None                  # flag off: the graph as built

    run = run_zoo(model, data_dir, tmp_path / "ckpt", ["--stage_threads", "1"])
    _assert_trained_and_evaluated(run)
    record = live_rewrite_of(run.graph)
    assert record is not None and record.changed                    # the flag took effect: ops moved
    assert any(stage.moved for stage in record.stages)
    assert run.losses == reference.losses
    assert (run.acc, run.auc) == (reference.acc, reference.auc)


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
