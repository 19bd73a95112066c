"""Runtime test fixtures."""

from __future__ import annotations

import time

import pytest

from tests.runtime.helpers import BOUND_SECONDS, prefetch_threads_alive


@pytest.fixture(autouse=True)
def no_prefetch_thread_left():
    """Every test must leave no prefetch thread running once its sessions are closed."""
    yield
    deadline = time.monotonic() + BOUND_SECONDS
    while prefetch_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch_threads_alive() == []


def pytest_collection_modifyitems(config, items):
    """An exception escaping a prefetch thread fails the runtime test that caused it."""
    here = str(config.rootpath / "tests" / "runtime")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"))
