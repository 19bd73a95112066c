"""The ordered producer of one stage: tickets, lanes and a merger, so batches keep input order.

    before:  k threads each run the put        -> batch order depends on who finishes first
    after:   ticket n: head (serial) -> body on a lane -> merger moves n after n-1   -> input order

With one active lane (or no lanes) it runs the plain put once per batch (ticket order is then trivial).
With k > 1 lanes every worker thread, in turn: takes the next ticket and runs the head under one lock
(fetching the values the body reads), runs the body fed those values into its own lane queue, and records
"ticket n is in lane i". The merger moves tickets 0, 1, 2, ... in order into the stage buffer. What each
ticket's outcome means:

- moved / in a lane: the batch goes into the buffer in its turn;
- an ignored-type error: the ticket is skipped (logged), the others go on;
- end of input (closed-type error): every earlier ticket is moved, then the buffer closes;
- any other error: every earlier ticket is moved, the buffer closes, and the error waits until the
  step has taken every good batch (the host's fail_in_order, PrefetchThreads.defer_error), then arrives
  as itself; no later ticket is ever moved, and no head runs after the failing one.
"""

from __future__ import annotations

import logging
import threading
import time

from smartstage.runtime.lanes.lanes import LaneGraph, discard_leftovers
from smartstage.runtime.lanes.producers.callables import ProducerRuns
from smartstage.runtime.lanes.producers.control import wait_below
from smartstage.runtime.lanes.producers.host import ProducerHost

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05        # how often a waiting worker looks at the stop flags


class OrderedProducer:
    """`max_threads` lane threads and a merger for one stage; `num_threads` of them produce at a time (1:
    the plain put)."""

    def __init__(self, host: ProducerHost, lanes: LaneGraph | None, runs: ProducerRuns | None = None):
        self.host = host
        self.sess = host.sess
        self.lanes = lanes
        self.tuner = host.tuner
        self.meter = host.meter
        self.max_threads = len(lanes.lanes) if lanes is not None else 1
        self._cond = threading.Condition()
        self._head_lock = threading.Lock()
        self._next_ticket = 0
        self._merged = 0
        self._outcomes: dict[int, tuple] = {}
        self._head_done = False
        self._lane_last = [-1] * self.max_threads
        self.lane_batches = [0] * self.max_threads
        self._occupancy = 0
        self._warming = 0                   # workers building their executors now (_warm)
        self._ready = [False] * self.max_threads  # workers whose lane has its executors (_warm "lane")
        self.num_threads = min(self.tuner.num_threads, self.max_threads)
        self.soft_capacity = self.tuner.capacity if self.tuner.tune_capacity else None
        self.threads: list[threading.Thread] = []
        # callables (runtime/lanes/producers/callables.py); the stage's own when it keeps them across re-initialisations
        self.runs = runs if runs is not None else ProducerRuns(self.sess, enabled=host.remote is None)
        self._builds_judged = self.runs.builds  # executors built before the tuner's current window

    # -- control -----------------------------------------------------------------------------------
    def halted(self) -> bool:
        return self.host.halted()

    def apply(self, num_threads: int, capacity: int) -> None:
        """New settings from the tuner; they take effect at the next ticket (no step waits for them)."""
        with self._cond:
            self.num_threads = max(1, min(num_threads, self.max_threads))
            if self.soft_capacity is not None:
                self.soft_capacity = capacity
            self._cond.notify_all()

    def discard_lane_leftovers(self) -> None:
        if self.lanes is not None:
            discard_leftovers(self.host.control_run, self.lanes.lanes)

    def start(self, prime: bool) -> None:
        if prime and not self._prime():
            return
        names = [f"smartstage-prefetch-{self.host.name}-{i}" for i in range(self.max_threads)]
        self.threads = [threading.Thread(target=self._work, args=(i,), name=n, daemon=True)
                        for i, n in enumerate(names)]
        self.threads.append(threading.Thread(target=self._merge, name=f"smartstage-prefetch-{self.host.name}-merger",
                                             daemon=True))
        for thread in self.threads:
            thread.start()

    def _prime(self) -> bool:
        """Ticket 0 in the caller's thread (a resettable stage: an uninitialised iterator or an input
        already at its end is known before any step takes). True: start the threads."""
        self._next_ticket = 1
        outcome = self._run_direct(0)
        if outcome[0] == "error":
            self.host.finish(outcome[1], deferred=False)
            return False
        self._outcomes[0] = outcome
        return True

    # -- workers -----------------------------------------------------------------------------------
    def _record(self, ticket: int, outcome: tuple) -> None:
        with self._cond:
            self._outcomes[ticket] = outcome
            if outcome[0] == "error":
                self._head_done = True   # no head runs after a failing ticket
            self._cond.notify_all()

    def _wait_turn(self, index: int) -> bool:
        with self._cond:
            while not (self.halted() or self._head_done
                       or (index < self.num_threads and self._lane_last[index] < self._merged)):
                self._cond.wait(POLL_SECONDS)
            return not (self.halted() or self._head_done)

    def _warm(self, index: int, parts: set[str]) -> None:
        """Builds this worker's executors before it takes a ticket (runtime/lanes/producers/callables.py): the
        first batch of a lane the tuner tries must not carry them, nor stall the merger. `parts`: "lane" (its
        lane's move, needed once 2 or more lanes run; the head's run serves every lane and pool and the body
        runs are fed, so both go through run(), which builds them on their first batch; so does the one-lane
        put). Lanes are built when
        they first run, not at start: lanes the tuner never tries cost none (on the Wide&Deep port's ~2,000-op
        body, a lane's runs took ~1 s of CPU from the first steps).
        The tuner judges no window in which executors were built, here or on a run's first use (a pool the
        tuner tries): the CPU that takes is not the setting's (_tune)."""
        lanes, options = self.lanes, self.host.run_options
        if lanes is None or self.host.feed_values:
            return
        lane = lanes.lanes[index]
        runs = []
        if "lane" in parts:  # (a one-lane put goes through run(): _direct_fetches says why)
            runs.append(([lane.occupancy], options))
        with self._cond:
            self._warming += 1
        try:
            for fetches, run_options in runs:
                if self.halted():
                    return
                self.runs.prepare(fetches, run_options)
        finally:
            with self._cond:
                self._warming -= 1

    def _direct_fetches(self) -> list:
        """The one-lane put's fetches: with lanes, the occupancy and the batch's bytes, every run. A run that
        fetched the bytes only now and then would be a second fetch list, and every fetch list's executors
        are built once, stalling the whole session while they are (callables.py). The put runs through run(),
        not a callable: run()'s executors serve every pool, while a callable is made per RunOptions, so the
        tuner's pool trial would build the put again inside the first steps."""
        if self.lanes is None:
            return [self.host.put]
        return [self.lanes.put_occupancy, self.lanes.batch_bytes]

    def _body_fetches(self, index: int) -> list:
        """A lane's body run; lane 0's always fetches the batch's bytes too (one fetch list, one build)."""
        lane = self.lanes.lanes[index]
        if index != 0:
            return [lane.enqueue]
        return [lane.enqueue, self.lanes.batch_bytes]

    def _lanes_ready(self) -> bool:
        """Whether an active lane has its executors (under _cond): until one has, worker 0 puts directly."""
        return any(self._ready[:self.num_threads])

    def _work(self, index: int) -> None:
        while self._wait_turn(index):
            lanes_run = self.lanes is not None and (self.num_threads > 1 or self.host.remote is not None)
            with self._cond:  # worker 0 warms its lane only once another lane can produce meanwhile (or no put)
                warm = lanes_run and not self._ready[index] and (index > 0 or self._lanes_ready()
                                                                 or self.host.remote is not None)
            if warm:  # before taking a ticket: the other workers go on meanwhile
                self._warm(index, {"lane"})
                with self._cond:
                    self._ready[index] = True
                continue
            with self._head_lock:
                with self._cond:
                    if self._head_done or index >= self.num_threads or (index > 0 and not self._ready[index]):
                        continue
                    ticket = self._next_ticket
                    self._next_ticket += 1
                    # a stage on input tasks always runs its lanes (the body's timeout, the task's name);
                    # one lane, or lanes still building their executors: worker 0 runs the put itself
                    direct = self.lanes is None or (self.host.remote is None
                                                    and (self.num_threads == 1 or not self._ready[index]))
                if direct:
                    self._direct(ticket)
                    continue
                head = self._run_head(ticket)
            if head is not None:
                self._run_body(index, ticket, *head)
        logger.debug("prefetch worker %d of stage %s stopped", index, self.host.name)

    def _direct(self, ticket: int) -> None:
        with self._cond:  # every earlier ticket must be in the buffer before this put
            while self._merged < ticket and not self.halted():
                self._cond.wait(POLL_SECONDS)
        self._gate(computes=True)
        if self.halted():  # stopped while waiting: this batch is not made (a stop never adds one)
            self._record(ticket, ("quiet",))
            return
        self._record(ticket, self._run_direct(ticket))

    def _run_direct(self, ticket: int) -> tuple:
        host = self.host
        started = time.monotonic()
        try:
            feed = host.feed_dict()
            fetches = self._direct_fetches()
            measure_bytes = self.lanes is not None and (ticket < 4 or ticket % 16 == 0)
            with host.in_flight(0):
                values = self.runs.run(fetches, host.run_options, feed, rare=True)  # run(): every pool
            if self.lanes is None and self.soft_capacity is not None and host.size is not None:
                values[0] = self.sess.run(host.size)  # the occupancy the soft cap needs
        except Exception as error:  # noqa: BLE001  classified by the merger, in ticket order
            return self._classified(ticket, error)
        self.meter.produced(time.monotonic() - started, 0.0)
        self.lane_batches[0] += 1
        if measure_bytes:
            self._bytes_seen(values[1])
        return ("moved", None if values[0] is None else int(values[0]))

    def _classified(self, ticket: int, error: Exception) -> tuple:
        kind = self.host.classify(error)
        if kind == "ignored":
            logger.warning("stage %s: ignores an error at batch %d and goes on: %s", self.host.name, ticket, error)
            return ("skip",)
        return ("error", error)

    def _record_error(self, ticket: int, error: Exception) -> None:
        outcome = self._classified(ticket, error)
        if outcome[0] == "skip":
            with self._cond:
                self._outcomes[ticket] = outcome
                self._cond.notify_all()
        else:
            self._record(ticket, outcome)

    def _run_head(self, ticket: int):
        """The head's run for `ticket`: the values the body reads (split.cut), fetched, and the head targets
        run. Through run(), as the put: its executors serve every pool the tuner tries."""
        split = self.lanes.split
        started = time.monotonic()
        try:
            feed = self.host.feed_dict()
            values = []
            targets = [self.lanes.head_targets] if self.lanes.head_targets is not None else []
            if split.cut or targets:
                values = self.runs.run([*split.cut, *targets], self.host.run_options, feed,
                                       rare=True)[:len(split.cut)]
        except Exception as error:  # noqa: BLE001
            self._record_error(ticket, error)
            return None
        return values, feed or {}, time.monotonic() - started

    def _run_body(self, index: int, ticket: int, values, feed: dict, head_seconds: float) -> None:
        feed = {**feed, **dict(zip(self.lanes.split.cut, values))}
        # lane 0 measures the batch's bytes, in the same fetch list (the original's bytes would run the head again)
        fetches = self._body_fetches(index)
        measure_bytes = index == 0 and (ticket < 4 or ticket % 16 == 0)
        started = time.monotonic()
        try:
            result = self.runs.run(fetches, self.host.body_run_options, feed or None)
        except Exception as error:  # noqa: BLE001
            self._record_error(ticket, self.host.lane_error(error, index))
            return
        self.meter.produced(head_seconds, time.monotonic() - started)
        self.lane_batches[index] += 1
        if measure_bytes:
            self._bytes_seen(result[1])
        with self._cond:
            self._lane_last[index] = ticket
        self._record(ticket, ("lane", index))

    def _bytes_seen(self, value) -> None:
        self.meter.bytes_seen(value)
        if self.soft_capacity is not None and self.tuner.cap_capacity(self.meter.batch_bytes):
            self.apply(self.tuner.num_threads, self.tuner.capacity)

    def _gate(self, computes: bool = False) -> None:
        """With a tuned capacity, waits until the buffer has room under the soft cap.

        computes: the run that follows computes the batch and enqueues it (the one-lane put). A bounded
        queue of capacity C lets that run compute while C batches wait and blocks only its enqueue, so
        the batch is ready the moment a step takes one; gating such a run at C would compute only after
        the step took, leaving the step to wait. So it waits while more than C batches are buffered: at
        most C + 1, as with the bounded queue (C queued + 1 held by its blocked enqueue), while that fits
        max_buffered_bytes. A lane's move only enqueues a batch its body already computed: it waits for
        room under C.
        """
        cap = self.soft_capacity
        if cap is None:
            return
        extra = self.tuner.headroom(self.meter.batch_bytes) if computes else 0  # never past the byte cap
        if self._occupancy < cap + extra:
            return
        seen = wait_below(self.sess, self.host.size, lambda: (self.soft_capacity or cap) + extra, self.halted,
                          self.meter.seconds_per_batch)
        if seen is not None:
            self._occupancy = seen

    # -- merger ------------------------------------------------------------------------------------
    def _merge(self) -> None:
        while True:
            with self._cond:
                while self._merged not in self._outcomes and not self.halted():
                    self._cond.wait(POLL_SECONDS)
                if self.halted() and self._merged not in self._outcomes:
                    return
                ticket = self._merged
                outcome = self._outcomes.pop(ticket)
            kind = outcome[0]
            if kind in ("error", "quiet"):
                if kind == "error":
                    self.host.finish(outcome[1], deferred=True)
                return
            if kind == "lane":
                started = time.monotonic()
                self._gate()
                if self.halted():
                    return
                try:
                    with self.host.in_flight(self.max_threads):
                        lane = self.lanes.lanes[outcome[1]]
                        occupancy = self.runs.run([lane.occupancy], self.host.run_options)[0]
                except Exception as error:  # noqa: BLE001
                    if not self.halted():
                        self.host.finish(error, deferred=True)
                    return
                self._occupancy = int(occupancy)
                self.meter.moved(time.monotonic() - started, self._occupancy)
            elif kind == "moved":
                if outcome[1] is not None:
                    self._occupancy = outcome[1]
                self.meter.moved(0.0, outcome[1])
            with self._cond:
                self._merged += 1
                self._cond.notify_all()
            self._tune()

    def _tune(self) -> None:
        now = time.monotonic()
        if not self.meter.window_full(now, self.tuner.window_seconds()):
            return
        window = self.meter.close_window(now)
        builds = self.runs.builds
        with self._cond:
            built = self._warming > 0 or builds != self._builds_judged
        self._builds_judged = builds
        if built and not self.tuner.skips_next_window:  # executors were built in this window: their CPU is
            return                                         # not the setting's, judge the next one
        if self.tuner.observe(window, self.meter.last_rate, self.meter.batch_bytes):
            logger.debug("stage %s: autotune tries %d lanes, capacity %d, %s pool (%s)", self.host.name,
                         self.tuner.num_threads, self.tuner.capacity, "own" if self.tuner.own_pool else "shared",
                         self.tuner.reason)
            self.apply(self.tuner.num_threads, self.tuner.capacity)
