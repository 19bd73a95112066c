"""The TF2 tests run in eager mode, TensorFlow 2's default, inside a suite whose conftest turned it off.

    pytestmark = pytest.mark.usefixtures("eager")   # a test module that needs TF2's eager mode

`context.eager_mode()` is the scope TensorFlow's own tests use to run a block eagerly in a graph-mode process;
nothing leaks out of it, so the v1 tests that run in the same process keep their graph mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorflow.python.eager import context

from tests.bounds import JOB_HANG_SECONDS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def eager():
    """Eager execution for one test (tf.function, tf.data iteration, Keras fit), as in a user's TF2 script."""
    with context.eager_mode():
        yield


@pytest.fixture(autouse=True)
def state_checked(monkeypatch):
    """Every TF2 test runs with the state check on (smartstage.tf2.step.user_state): whatever decides a split
    (analysis, tracing, the trial) raises StateChangedError if it changes the user's variables, seeds,
    generators or the next iteration of the user's dataset."""
    from smartstage.tf2.step.user_state import CHECK_STATE_ENV

    monkeypatch.setenv(CHECK_STATE_ENV, "1")


@pytest.fixture(autouse=True)
def fit_splits_untimed(monkeypatch):
    """ss.tf2.fit times a new split against the model's own step and keeps the faster program
    (smartstage.tf2.step.trial), which depends on the machine's load. Tests of what fit splits, and of its values,
    split whatever the timing says (measure=False); tests/tf2/test_trial.py tests the timing itself through
    smartstage.tf2.keras.fit.fit."""
    import functools

    import smartstage.tf2
    from smartstage.tf2.keras import fit as keras_fit

    monkeypatch.setattr(smartstage.tf2, "fit", functools.partial(keras_fit.fit, measure=False))


@pytest.fixture(scope="session")
def run_eager_child(tmp_path_factory):
    """Runs a test file as a user's TF2 script in a child process (no conftest there, so eager execution is on):
    `python <file> <dir>`; returns the JSON record the child wrote to `<dir>/<record>`.

        before:  subprocess.run([sys.executable, __file__, out], ...) and json.loads(...) in each eager test module
        after:   run_eager_child(__file__, "calls.json") -> {"staged": {"raised": "EagerModeError", ...}, ...}
    """
    def run(script: str, record: str, timeout: float = JOB_HANG_SECONDS) -> dict:
        out = tmp_path_factory.mktemp(Path(script).stem)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
        proc = subprocess.run([sys.executable, str(script), str(out)], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((out / record).read_text())

    return run
