"""The producer's runs as TensorFlow callables: executors built ahead of time, less Python per run.

    before:  sess.run([lane_1/enqueue], options=...)      # executors built on lane 1's first batch
    after:   runs = ProducerRuns(sess, options); runs.prepare([lane_1/enqueue]); runs.run([lane_1/enqueue])

`Session.run` builds the executors of a new fetch signature on its first call; for a lane whose body
is a copy of hundreds of nodes that takes long enough to stall the merger on the lane's first ticket,
right inside the window in which the tuner judges the lane. A callable (`CallableOptions`: fetches,
targets and the RunOptions) builds them when it is made, which a lane's thread does before it takes
its first ticket, and then skips run()'s fetch/feed handling (about 40 us of CPU a run here). A run
with feeds, or a session that cannot make callables (a MonitoredSession's wrapper, a remote target),
goes through `sess.run` as before.

Off the step's path: a build made while another run can produce (a lane the tuner tries, `low_priority`)
runs in a helper thread at niceness +BUILD_NICE, so it takes the CPU the step and the producing runs
leave; a fetch list whose options changed (the tuner tries the other pool) keeps running its callable
with the old options while the new one is built that way. `builds` changes while any build is under
way, so the tuner judges no window that overlapped one.
"""

from __future__ import annotations

import logging
import os
import threading

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.runtime.producers.control import session_closed

logger = logging.getLogger(__name__)

BUILD_NICE = 10  # niceness of an off-path build's thread: CFS gives it ~1/10 of a core that the step wants


def _at_low_priority(make):
    """make() in a helper thread at niceness +BUILD_NICE (Linux: per thread); its result, or its error raised."""
    outcome: dict = {}

    def body() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILD_NICE)
        except (AttributeError, OSError):  # no per-thread niceness here: build at the caller's priority
            pass
        try:
            outcome["value"] = make()
        except BaseException as error:  # noqa: BLE001  re-raised in the caller's thread
            outcome["error"] = error

    helper = threading.Thread(target=body, name="smartstage-executor-build", daemon=True)
    helper.start()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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
        self._built = 0  # executors built so far (callables made, fetch lists first run): CPU taken from the step
        self._building: set[tuple] = set()  # keys whose callable a background thread makes now
        self._reads_while_building = 0
        self._run_signatures: set[tuple] = set()

    @property
    def builds(self) -> int:
        """A count that grows with every executor build, and on every read while one is under way: a tuner
        window that saw it change measured CPU that was not its setting's.

            before:  judged = runs.builds; ... a window ...   # a 1.5 s background build spans three windows
            after:   runs.builds != judged                    # True for each of them, and once after it
        """
        with self._lock:
            if self._building:
                self._reads_while_building += 1
            return self._built + self._reads_while_building

    def _key(self, fetches: list, options: config_pb2.RunOptions) -> tuple:
        # The options are the stage's own RunOptions objects, which live as long as the producer (each
        # callable keeps its object, so an id is never reused while cached); no serialization per run.
        return tuple(f.name for f in fetches), id(options)

    def prepare(self, fetches: list, options: config_pb2.RunOptions, low_priority: bool = False):
        """Makes (once) the callable of `fetches` (tensors and operations); None when runs go through run().

        low_priority: the build runs at niceness +BUILD_NICE (another run produces meanwhile: a lane's warm-up)."""
        if self._base is None:
            return None
        key = self._key(fetches, options)
        found = self._callables.get(key)
        if found is not None:
            return found[0]
        if session_closed(self._base):
            return None
        callable_options = config_pb2.CallableOptions(
            fetch=[f.name for f in fetches if isinstance(f, tf.Tensor)],
            target=[f.name for f in fetches if isinstance(f, tf.Operation)], run_options=options)
        base = self._base
        try:  # outside the lock: building executors takes a while, and other runs must not wait for it
            make = lambda: base._make_callable_from_options(callable_options)  # noqa: E731, SLF001
            made = _at_low_priority(make) if low_priority else make()
        except (tf.errors.OpError, RuntimeError, TypeError, AttributeError) as error:
            logger.debug("no callable for %s (runs go through run()): %s", key[0], error)
            self._base = None  # a session that cannot: run() from now on
            return None
        with self._lock:
            self._built += 1
            return self._callables.setdefault(key, (made, options))[0]

    def _other_options(self, fetches: list, options: config_pb2.RunOptions):
        """A ready callable of the same fetch list made with other RunOptions, and its options; None if none."""
        names = tuple(f.name for f in fetches)
        with self._lock:
            for (made_names, _), (made, made_options) in self._callables.items():
                if made_names == names and made_options is not options:
                    return made, made_options
        return None

    def _build_in_background(self, fetches: list, options: config_pb2.RunOptions) -> None:
        key = self._key(fetches, options)
        with self._lock:
            if key in self._building:
                return
            self._building.add(key)

        def build() -> None:
            try:
                self.prepare(fetches, options, low_priority=True)
            finally:
                with self._lock:
                    self._building.discard(key)

        threading.Thread(target=build, name="smartstage-executor-build-switch", daemon=True).start()

    def run(self, fetches: list, options: config_pb2.RunOptions, feed: dict | None = None, rare: bool = False) -> list:
        """The values of `fetches` (None for an operation), as `sess.run(fetches, feed, options)` gives them.

        rare: a run made now and then (a batch's bytes, every 16th batch) goes through run(): a callable
        always builds new executors, per RunOptions (~0.15-0.9 s of CPU each on a ~2,000-op body, measured
        on the Wide&Deep port), while run() builds them once per fetch list whatever the pool."""
        made = None
        if not (feed or rare) and self._base is not None:
            with self._lock:
                found = self._callables.get(self._key(fetches, options))
            made = found[0] if found is not None else None
            if made is None:
                previous = self._other_options(fetches, options)
                if previous is not None:  # the tuner switched the pool: old options until the new callable is made
                    self._build_in_background(fetches, options)
                    made = previous[0]
                else:
                    made = self.prepare(fetches, options)
        if made is None:
            signature = tuple(f.name for f in fetches)
            with self._lock:  # run() builds its executors on a fetch list's first run
                if signature not in self._run_signatures:
                    self._run_signatures.add(signature)
                    self._built += 1
            return self.sess.run(fetches, feed_dict=feed, options=options)
        if session_closed(self._base):
            raise RuntimeError("Attempted to use a closed Session.")
        values = iter(made())
        return [next(values) if isinstance(f, tf.Tensor) else None for f in fetches]


__all__ = ["ProducerRuns"]
