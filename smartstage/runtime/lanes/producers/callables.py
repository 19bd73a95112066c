"""The producer's runs as TensorFlow callables: executors built ahead of time, less Python per run.

    before:  sess.run([lane_1/enqueue], options=...)      # executors built on lane 1's first batch
    after:   runs = ProducerRuns(sess, options); runs.prepare([lane_1/enqueue]); runs.run([lane_1/enqueue])

`Session.run` builds the executors of a new fetch signature on its first call; for a lane whose body
is hundreds of nodes that takes long enough to stall the merger on the lane's first ticket,
right inside the window in which the tuner judges the lane. A callable (`CallableOptions`: fetches,
targets and the RunOptions) builds them when it is made, which a lane's thread does before it takes
its first ticket, and then skips run()'s fetch/feed handling (tens of microseconds of CPU a run). A run
with feeds, or a session that cannot make callables (a MonitoredSession's wrapper, a remote target),
goes through `sess.run` as before.

Every build stalls the whole session: while TensorFlow (2.21) builds executors for one fetch list, other
runs of the same session, the training step and existing callables included, wait for nearly all of the
build, so a build during training is a step that long. No thread or priority takes a build off the step's
path; only fewer builds do, or builds before the first step.
"""

from __future__ import annotations

import logging
import threading
import time

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.runtime.lanes.producers.control import session_closed

logger = logging.getLogger(__name__)


def _base_session(sess):
    """The tf.compat.v1.Session behind `sess` (itself, or the session a thin runner wraps); None if none."""
    for candidate in (sess, getattr(sess, "_session", None)):
        if isinstance(candidate, tf.compat.v1.Session) and not candidate.sess_str:
            return candidate  # in-process only: a remote target's callables are left to run()
    return None


class ProducerRuns:
    """Runs fixed fetch lists of one stage's producer through callables made once per list."""

    def __init__(self, sess, enabled: bool = True):
        self.sess = sess
        self._base = _base_session(sess) if enabled else None
        self._lock = threading.Lock()
        self._callables: dict[tuple, tuple[object, config_pb2.RunOptions]] = {}  # key -> (callable, its options)
        self.builds = 0  # executors built so far (callables made, fetch lists first run): CPU taken from the step
        self.build_cpu_seconds = 0.0  # thread CPU of the callables made (a run()'s first run is not timed)
        self._run_signatures: set[tuple] = set()
        self._building: dict[tuple, threading.Event] = {}  # fetch lists whose callable a thread makes now

    def _key(self, fetches: list, options: config_pb2.RunOptions) -> tuple:
        # The options are the stage's own RunOptions objects, which live as long as the producer (each
        # callable keeps its object, so an id is never reused while cached); no serialization per run.
        return tuple(f.name for f in fetches), id(options)

    def prepare(self, fetches: list, options: config_pb2.RunOptions):
        """Makes (once) the callable of `fetches` (tensors and operations); None when runs go through run()."""
        if self._base is None:
            return None
        key = self._key(fetches, options)
        with self._lock:  # workers may warm the same fetch list: one builds, the others wait
            found = self._callables.get(key)
            building = self._building.get(key) if found is None else None
            if found is None and building is None:
                self._building[key] = threading.Event()
        if found is not None:
            return found[0]
        if building is not None:
            building.wait()
            found = self._callables.get(key)
            return found[0] if found is not None else None
        try:
            return self._make(key, fetches, options)
        finally:
            with self._lock:
                self._building.pop(key).set()

    def _make(self, key: tuple, fetches: list, options: config_pb2.RunOptions):
        if self._base is None or session_closed(self._base):
            return None
        callable_options = config_pb2.CallableOptions(
            fetch=[f.name for f in fetches if isinstance(f, tf.Tensor)],
            target=[f.name for f in fetches if isinstance(f, tf.Operation)], run_options=options)
        started = time.thread_time()
        try:  # outside the lock: building executors takes a while, and other runs must not wait for it
            made = self._base._make_callable_from_options(callable_options)  # noqa: SLF001
        except (tf.errors.OpError, RuntimeError, TypeError, AttributeError) as error:
            logger.debug("no callable for %s (runs go through run()): %s", key[0], error)
            self._base = None  # a session that cannot: run() from now on
            return None
        with self._lock:
            self.builds += 1
            self.build_cpu_seconds += time.thread_time() - started
            return self._callables.setdefault(key, (made, options))[0]

    def run(self, fetches: list, options: config_pb2.RunOptions, feed: dict | None = None,
            rare: bool = False) -> list:
        """The values of `fetches` (None for an operation), as `sess.run(fetches, feed, options)` gives them.

        rare: the run goes through run(), not a callable: a callable is made per RunOptions, so under the pool
        the tuner tries its executors would be built a second time (a stall of the whole session under its
        executor lock), while run() builds them once per fetch list whatever the pool, at a little more CPU
        a run. For runs made now and then (a batch's bytes, every 16th batch) and for runs whose fetch list
        serves several pools (the one-lane put, the head)."""
        made = None if feed or rare else self.prepare(fetches, options)
        if made is None:
            signature = tuple(f.name for f in fetches)
            with self._lock:  # run() builds its executors on a fetch list's first run
                if signature not in self._run_signatures:
                    self._run_signatures.add(signature)
                    self.builds += 1
            return self.sess.run(fetches, feed_dict=feed, options=options)
        if session_closed(self._base):
            raise RuntimeError("Attempted to use a closed Session.")
        values = iter(made())
        return [next(values) if isinstance(f, tf.Tensor) else None for f in fetches]


__all__ = ["ProducerRuns"]
