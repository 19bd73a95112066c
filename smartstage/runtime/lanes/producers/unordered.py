"""The unordered producer of one stage (`staged(..., deterministic=False)`): k threads each run the put.

    before:  StageDef(unordered=True, num_threads=3), its put never run
    after:   UnorderedProducer(host, 3).start()   # 3 threads run put(body(head())) at once, batches in any order

The explicit opt-out of input order, kept as it always ran: every thread runs the whole put, over and over.
What an error means (the host's `classify`): end of input ends the thread, and the buffer closes once every
thread ended so; an ignored-type error is logged and the thread goes on; an unexpected one reaches the
step after the batches buffered before it (the host's `fail_in_order`).
"""

from __future__ import annotations

import logging
import threading

from smartstage.runtime.lanes.producers.control import wait_below
from smartstage.runtime.lanes.producers.host import ProducerHost

logger = logging.getLogger(__name__)


class UnorderedProducer:
    """`count` threads that each run the stage's put until the input ends or the stage stops."""

    def __init__(self, host: ProducerHost, count: int):
        self.host = host
        self.count = count
        self.num_threads = count    # what stats() reports as the threads in force
        self.soft_capacity = None    # the tuned capacity is the tuner's (unordered puts wait for room themselves)
        self.lane_batches: tuple[int, ...] = ()
        self.threads: list[threading.Thread] = []
        self._closed_threads = 0
        self._lock = threading.Lock()

    def discard_lane_leftovers(self) -> None:
        """An unordered stage has no lanes: nothing is left behind by a stop."""

    def start(self, prime: bool) -> None:
        if prime and not self._prime():
            return
        name = self.host.name
        self.threads = [threading.Thread(target=self._loop, args=(index,), name=f"smartstage-prefetch-{name}-{index}",
                                         daemon=True) for index in range(self.count)]
        for thread in self.threads:
            thread.start()

    def _prime(self) -> bool:
        """A resettable stage runs its put once before its threads start, in the caller's thread: an
        iterator that is not initialised is known before any step can take (no step then waits for a
        batch that will not come), and so is an input that is already at its end. True: start the threads."""
        try:
            self._run_put(None)
            return True
        except Exception as error:  # noqa: BLE001  classified like the threads' errors
            if getattr(error, "error_code", None) in self.host.closed_codes:
                with self._lock:
                    self._closed_threads = self.count - 1
                self._thread_closed()
                return False
            return self._handle(error, 0)

    def _wait_for_room(self) -> None:
        """With a tuned capacity, a put may start at the soft cap (ordered.py, OrderedProducer._gate, says why)."""
        host = self.host
        if host.settings.tune_capacity and host.size is not None:
            tuner, meter = host.tuner, host.meter
            cap = lambda: tuner.capacity + tuner.headroom(meter.batch_bytes)  # noqa: E731
            wait_below(host.sess, host.size, cap, host.halted, meter.seconds_per_batch)

    def _run_put(self, index: int | None) -> None:
        """One put; `index` None: the priming put, which the timeout watchdog does not watch."""
        self._wait_for_room()
        feed = self.host.feed_dict()
        with self.host.in_flight(index):
            self.host.sess.run(self.host.put, feed_dict=feed, options=self.host.run_options)

    def _loop(self, index: int) -> None:
        host = self.host
        while not host.stopping() and not host.paused():
            try:
                self._run_put(index)
            except Exception as error:  # noqa: BLE001  every outcome is classified below
                if not self._handle(error, index):
                    return
        logger.debug("prefetch thread %d of stage %s stopped", index, host.name)

    def _handle(self, error: Exception, index: int) -> bool:
        """What an error from an unordered prefetch run means; True: the thread goes on."""
        host = self.host
        kind = host.classify(error)
        if kind == "shutdown":
            logger.debug("prefetch thread %d of stage %s ends on shutdown: %s", index, host.name, error)
            return False
        if kind == "closed":
            logger.info("prefetch thread %d of stage %s reached the end of its input", index, host.name)
            self._thread_closed()
            return False
        if kind == "ignored":
            logger.warning("stage %s: prefetch thread %d ignores an error and goes on: %s", host.name, index, error)
            return True
        if kind == "cancelled":
            logger.info("stage %s: buffer closed or cancelled; prefetch thread %d ends", host.name, index)
            return False
        if kind == "uninitialized":
            host.wait_for_initializer(index)
            return False
        host.fail_in_order(error)
        return False

    def _thread_closed(self) -> None:
        with self._lock:
            self._closed_threads += 1
            last = self._closed_threads == self.count
        if last:
            self.host.close_buffer("every prefetch thread reached the end of input")


__all__ = ["UnorderedProducer"]
