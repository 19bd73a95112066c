"""Control runs: the small runs a stage's threads make besides the put (close, cancel, stale marks), which a
closed session or an already closed buffer must not turn into errors.

    quiet_run(sess, stage.close, "close of stage 'stage'")   # True if it ran, False if there was nothing to do
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2


logger = logging.getLogger(__name__)

CONTROL_RUN_MILLIS = 30000  # close / cancel / ready runs never wait longer than this


def session_closed(sess) -> bool:
    return bool(getattr(sess, "_closed", False))


def quiet_run(sess, fetch, what: str, timeout_millis: int = CONTROL_RUN_MILLIS) -> bool:
    """Runs a control op (close, cancel); a closed session or a closed buffer is not an error."""
    if session_closed(sess):
        return False
    try:
        sess.run(fetch, options=config_pb2.RunOptions(timeout_in_ms=timeout_millis))
        return True
    except (tf.errors.OpError, RuntimeError) as error:
        logger.debug("%s did not run: %s", what, error)
        return False


SOFT_CAP_POLL_SECONDS = 0.0005  # the shortest look-again interval at a full (soft-capped) buffer ...
SOFT_CAP_MAX_SLEEP = 0.02       # ... and the longest


def wait_below(sess, size, capacity, halted, batch_seconds=lambda: 0.0) -> int | None:
    """Waits until the buffer's `size` op reads fewer batches than `capacity()` (a soft cap: the queue
    itself is bounded higher, so the threads keep under it); the size seen, or None when halted or failing.

    The step takes one batch per `batch_seconds()` (the measured pace; 0 while unknown), so a buffer
    `n` batches over the cap has room in about n steps: it looks again after half that time (within
    SOFT_CAP_POLL_SECONDS..SOFT_CAP_MAX_SLEEP). A fixed 1 ms poll cost a session run per millisecond
    on the cores the step needs.
    """
    while not halted():
        try:
            occupancy = int(sess.run(size))
        except (tf.errors.OpError, RuntimeError):
            return None
        cap = capacity()
        if occupancy < cap:
            return occupancy
        pause = 0.5 * (occupancy - cap + 1) * batch_seconds()
        time.sleep(min(max(pause, SOFT_CAP_POLL_SECONDS), SOFT_CAP_MAX_SLEEP))
    return None
