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
