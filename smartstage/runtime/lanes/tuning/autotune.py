"""`AUTOTUNE`: the runtime measures the pipeline while training and picks lanes and capacity itself.

    before:  ss.staged(features, capacity=40, num_threads=4)    # found by hand, per model and machine
    after:   ss.staged(features)                                # capacity=num_threads=ss.AUTOTUNE

What is measured, per batch (StageMeter): the head's and the body's time on the prefetch side, how long
the move into the buffer waited for room (the producer waiting for the step), the buffer's occupancy
right after the move, and the bytes of a batch; per window: batches per second (= steps per second
once the buffer neither fills nor drains). What is decided (Tuner), as tf.data's AUTOTUNE does:
start with one lane; while the buffer runs empty (the step waits for input), try one lane more and
keep it when steps/s rose by more than the noise margin (one that gained less, the buffer still empty, gets
one lane more judged against the best: a gentle slope), else go back and settle; capacity grows while
the buffer still runs dry at the chosen lane count, never above what `max_buffered_bytes` allows.
Then the pool, when it is AUTOTUNE and the session has a prefetch pool (runtime/lanes/tuning/pools.py): longer
windows alternate the prefetch runs between the shared pool and their own (own, shared, own, ...), and
the own pool is kept only when it ran faster than the shared one in most pairs and by more than
POOL_MARGIN in the median pair (alternating, so a machine whose load drifts favours neither).
After settling it keeps watching: three windows in a row with the buffer running empty at a pace
beyond the margin re-open the search (a full buffer at a new pace is the step's pace: nothing to tune). No
window is judged in which the buffer grew by more than half the batches moved (a step that idles). Every
change happens between two batches (no step waits for it). The settled choice is logged once and
kept in `TuningDecision`; `PipelineStats` is the live view (for hooks, TensorBoard).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from smartstage.runtime.lanes.tuning.meter import WINDOW_SECONDS, Window

logger = logging.getLogger(__name__)

AUTOTUNE_HARD_CAPACITY = 64  # the buffer queue's own bound when capacity is tuned (the soft cap lies below)
GAIN_MARGIN = 0.06     # a change must buy more than this fraction of steps/s to be kept
RETUNE_MARGIN = 0.25   # after settling, a throughput change this large re-opens the search ...
RETUNE_WINDOWS = 3     # ... when it lasts this many windows in a row
EMPTY_FRACTION = 0.3   # the buffer held at most one batch after this fraction of moves: input-bound
POOL_PAIRS = 3         # (own, shared) window pairs of the pool trial
POOL_WINDOW_SECONDS = 0.5  # a pool changes steps/s by a few percent: longer windows than the lanes' trials
POOL_MARGIN = 0.03     # the own pool must win the median pair by more than this fraction


@dataclass(frozen=True)
class TuningDecision:
    """What the tuner chose for one stage and why (readable from Python, logged once it settles)."""

    stage: str
    num_threads: int
    capacity: int
    own_pool: bool
    settled: bool
    reason: str
    tried: tuple[tuple[int, int, float], ...] = ()   # (lanes, capacity, batches/s) per window tried
    pool_tried: tuple[tuple[bool, float], ...] = ()  # (own pool, batches/s) per window of the pool trial


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of one stage's pipeline (the last measurement window, and totals).

    occupancy: mean batches in the buffer right after a move; empty_fraction: moves after which the
    buffer held at most one batch (the step was, or was about to be, waiting for input);
    producer_wait_seconds: mean time a move waited for room (the producer waiting for the step);
    step_seconds: mean time of a training step as the prefetch hook timed it (None without the hook);
    head/body_seconds: prefetch time per batch, serial and parallel parts; lane_batches: batches
    each lane produced (lane 0 includes the one-thread put).
    """

    stage: str
    num_threads: int
    capacity: int
    own_pool: bool
    ordered: bool
    batches: int
    batches_per_second: float
    occupancy: float
    empty_fraction: float
    producer_wait_seconds: float
    step_seconds: float | None
    head_seconds: float
    body_seconds: float
    batch_bytes: int
    lane_batches: tuple[int, ...]
    decision: TuningDecision | None = None


class Mode(enum.Enum):
    """Where the tuner of one stage stands; observe() judges a window according to it."""

    CLIMBING = "climbing"      # one lane (or capacity) more while the buffer runs empty, kept when it pays
    LEAPING = "leaping"        # one lane past a lane that gained under the margin, judged against the best
    TRIMMING = "trimming"      # one lane less on trial: the buffer stayed filled
    POOL_TRIAL = "pool trial"  # lanes and capacity chosen: windows alternate between the own and shared pool
    SETTLED = "settled"        # chosen; watching for the input to become the bound at a new pace


class Tuner:
    """Hill-climbs the lane count (and capacity) of one stage on measured batches/s, then tries its pool.

    tune_num_threads / tune_capacity / tune_pool: which settings are AUTOTUNE (explicit ones never change;
    tune_pool only when the session has a prefetch pool to try). max_threads: the lanes that exist;
    max_buffered_bytes: the cap on buffered bytes; own_pool: the pool in force (True: the prefetch pool).
    """

    def __init__(self, stage: str, num_threads: int, capacity: int, tune_num_threads: bool, tune_capacity: bool,
                 max_threads: int, max_buffered_bytes: int, own_pool: bool = False, tune_pool: bool = False,
                 pool_note: str = ""):
        self.stage = stage
        self.num_threads = num_threads
        self.capacity = capacity
        self.tune_num_threads = tune_num_threads and max_threads > 1
        self.tune_capacity = tune_capacity
        self.max_threads = max_threads
        self.max_buffered_bytes = max_buffered_bytes
        self.own_pool = own_pool
        self.tune_pool = tune_pool
        self.pool_note = pool_note  # why the pool is not tuned, when it is AUTOTUNE but cannot be (logged once settled)
        self.tried: list[tuple[int, int, float]] = []
        self.pool_tried: list[tuple[bool, float]] = []
        tunes = self.tune_num_threads or self.tune_capacity or self.tune_pool
        self.mode = Mode.CLIMBING if tunes else Mode.SETTLED
        self.reason = "measuring" if tunes else "explicit settings"
        if not tunes and pool_note:
            self.reason = f"explicit settings; {pool_note}"
        self._best: tuple[int, int, float] | None = None  # (lanes, capacity, rate) of the best window so far
        self._trim_from: tuple[int, int, float] | None = None  # TRIMMING: (lanes, capacity, rate) before the trial
        self._pool_windows: list[tuple[bool, float]] = []  # POOL_TRIAL: (own pool, rate) per window
        self._pool_decided = False
        self._lanes_reason = ""
        self._settled_rate: float | None = None
        self._skip_next = True  # the first window after a change still holds the old setting's batches
        self._moved_windows = 0  # consecutive settled windows off the settled throughput

    @property
    def settled(self) -> bool:
        return self.mode is Mode.SETTLED

    def capacity_limit(self, batch_bytes: int) -> int:
        """The most batches the byte cap allows (at least 1)."""
        if batch_bytes <= 0:
            return AUTOTUNE_HARD_CAPACITY
        return max(1, min(AUTOTUNE_HARD_CAPACITY, self.max_buffered_bytes // batch_bytes))

    def headroom(self, batch_bytes: int) -> int:
        """1 when one batch more than the capacity still fits the byte cap (a put computing while the buffer
        is at the cap holds it), else 0."""
        return int(batch_bytes <= 0 or (self.capacity + 1) * batch_bytes <= self.max_buffered_bytes)

    def decision(self) -> TuningDecision:
        return TuningDecision(self.stage, self.num_threads, self.capacity, self.own_pool, self.settled,
                              self.reason, tuple(self.tried), tuple(self.pool_tried))

    @property
    def skips_next_window(self) -> bool:
        """Whether the next window is skipped anyway (the first after a start or a change)."""
        return self._skip_next

    def window_seconds(self) -> float:
        """How long the current measurement window lasts (longer during the pool trial)."""
        return POOL_WINDOW_SECONDS if self.mode is Mode.POOL_TRIAL else WINDOW_SECONDS

    def cap_capacity(self, batch_bytes: int) -> bool:
        """Applies the byte cap as soon as a batch's size is known; True when capacity shrank."""
        limit = self.capacity_limit(batch_bytes)
        if self.tune_capacity and self.capacity > limit:
            self.capacity = limit
            self.reason = (f"capacity cut to {limit}: max_buffered_bytes={self.max_buffered_bytes} / "
                           f"{batch_bytes} B per batch")
            return True
        return False

    def observe(self, window: Window, rate: float, batch_bytes: int) -> bool:
        """One finished window; True when the settings changed.

            before:  Tuner(num_threads=1, tune_num_threads=True), a window whose buffer ran empty at 10 batches/s
            after:   True; num_threads=2, mode CLIMBING (the next window judges the second lane)
        """
        if not (self.tune_num_threads or self.tune_capacity or self.tune_pool):
            return False
        limit = self.capacity_limit(batch_bytes)
        if self.cap_capacity(batch_bytes):
            return True
        if self._skip_next:
            self._skip_next = False
            return False
        if window.filling():  # judged, a head start read as "the step sets the pace" settled one lane for good
            return False
        empty = window.empty / max(window.batches, 1)
        if self.mode is Mode.POOL_TRIAL:
            return self._pool_window(rate)
        self.tried.append((self.num_threads, self.capacity, round(rate, 2)))
        if not (self.settled or self.tune_num_threads or self.tune_capacity):  # only the pool is AUTOTUNE
            return self._settle(rate, "explicit lanes and capacity")
        if self.mode is Mode.SETTLED:
            return self._watch(rate, empty)
        if self.mode is Mode.TRIMMING:
            return self._trimmed(rate, empty)
        best = self._best
        if best is None or rate > best[2] * (1 + GAIN_MARGIN):
            self._best, self.mode = (self.num_threads, self.capacity, rate), Mode.CLIMBING
            # One lane more only while the input is the bound: a lane costs two more session runs per batch,
            # so a trial is not free. A lane that buys no more than GAIN_MARGIN is given back below.
            if empty >= EMPTY_FRACTION and self.tune_num_threads and self.num_threads < self.max_threads:
                return self._change(self.num_threads + 1, self._room(limit), "the buffer ran empty: one lane more")
            if empty >= EMPTY_FRACTION and self.tune_capacity and self.capacity * 2 <= limit:
                return self._change(self.num_threads, self.capacity * 2, "the buffer ran empty: capacity doubled")
            if empty < EMPTY_FRACTION:
                return self._trim_or_settle(rate)
            return self._settle(rate, "no more lanes or capacity to try")
        num_threads, capacity, best_rate = best
        if self._may_leap(num_threads, best_rate, rate, empty):
            # Each lane may buy less than the margin on a gentle slope (Wide&Deep io: 2 -> 3 lanes +1% in a
            # window, 2 -> 4 threads +10%): one lane further, judged against the best, tells a slope from a plateau.
            self.mode = Mode.LEAPING
            why = (f"{self.num_threads} lanes ran {rate:.1f} batches/s, a gain under {GAIN_MARGIN:.0%} over "
                   f"{num_threads} at {best_rate:.1f}, the buffer still empty: trying {self.num_threads + 1}")
            return self._change(self.num_threads + 1, self._room(limit), why)
        # The last change did not pay: go back to the best setting and settle there.
        why = (f"{self.num_threads} lanes / capacity {self.capacity} ran {rate:.1f} batches/s, "
               f"not more than {num_threads} lanes / capacity {capacity} at {best_rate:.1f}")
        changed = (num_threads, capacity) != (self.num_threads, self.capacity)
        self.num_threads, self.capacity = num_threads, capacity
        return self._settle(best_rate, why) or changed  # logs the setting it went back to

    def _room(self, limit: int) -> int:
        """The capacity for one lane more: a lane runs ahead only into room in the buffer, so with capacity
        tuned each lane gets two slots (within the byte cap's `limit`)."""
        return min(max(self.capacity, 2 * (self.num_threads + 1)), limit) if self.tune_capacity else self.capacity

    def _may_leap(self, best_num_threads: int, best_rate: float, rate: float, empty: float) -> bool:
        """Whether a lane more that gained, but less than the margin, with the buffer still empty, gets one more
        lane on trial (once: a second lane that does not pay either ends the search)."""
        return (self.tune_num_threads and self.mode is not Mode.LEAPING and self.num_threads == best_num_threads + 1
                and self.num_threads < self.max_threads and rate >= best_rate and empty >= EMPTY_FRACTION)

    def _trim_or_settle(self, rate: float) -> bool:
        """The buffer stays filled: the fewest lanes that keep it so win (a lane costs CPU the step could use;
        a lane kept on a warm-up window's low rate would otherwise stay for good)."""
        if self.tune_num_threads and self.num_threads > 1:
            self._trim_from, self.mode = (self.num_threads, self.capacity, rate), Mode.TRIMMING
            return self._change(self.num_threads - 1, self.capacity, "the buffer stays filled: trying one lane less")
        return self._settle(rate, "the buffer stays filled: the step, not the input, sets the pace")

    def _trimmed(self, rate: float, empty: float) -> bool:
        num_threads, capacity, before = self._trim_from
        self._trim_from = None
        if empty < EMPTY_FRACTION:  # one lane less still keeps the buffer filled: keep it, try another
            self._best = (self.num_threads, self.capacity, rate)
            return self._trim_or_settle(rate)
        self.num_threads, self.capacity = num_threads, capacity
        self._settle(before, f"{num_threads - 1} lanes let the buffer run empty, {num_threads} keep it filled")
        return True

    def _change(self, num_threads: int, capacity: int, why: str) -> bool:
        self.num_threads, self.capacity, self.reason, self._skip_next = num_threads, capacity, why, True
        return True

    def _settle(self, rate: float, why: str) -> bool:
        """Lanes and capacity are chosen: settles, or first tries the pool (True: the pool changed)."""
        if self.tune_pool and not self._pool_decided:
            self._lanes_reason, self._pool_windows, self.own_pool = why, [], True
            self.mode, self._skip_next = Mode.POOL_TRIAL, True
            self.reason = f"{why}; trying the prefetch pool against the shared one"
            return True  # the first window on the own pool is skipped: it makes that pool's executors
        if self.pool_note:
            why = f"{why}; {self.pool_note}"
        self.mode, self._settled_rate, self.reason, self._skip_next = Mode.SETTLED, rate, why, True
        logger.info("stage %s: autotune settled on %d lanes, capacity %d, %s pool (%.1f batches/s): %s",
                    self.stage, self.num_threads, self.capacity, "own" if self.own_pool else "shared", rate, why)
        return False

    def _pool_window(self, rate: float) -> bool:
        """One window of the pool trial: alternate until POOL_PAIRS (own, shared) pairs are measured, then decide."""
        trial = self._pool_windows
        trial.append((self.own_pool, rate))
        self.pool_tried.append((self.own_pool, round(rate, 2)))
        if len(trial) < 2 * POOL_PAIRS:
            self.own_pool = not self.own_pool
            return True
        ratios = sorted(own / max(shared, 1e-9) for (_, own), (_, shared) in zip(trial[0::2], trial[1::2]))
        median, wins = ratios[len(ratios) // 2], sum(r > 1.0 for r in ratios)
        own = median > 1 + POOL_MARGIN and wins > len(ratios) / 2
        pace = ", ".join(f"{r:.2f}" for r in ratios)
        why = (f"{self._lanes_reason}; {'own' if own else 'shared'} pool: the prefetch pool ran {median:.2f}x the "
               f"shared one in the median of {len(ratios)} alternating pairs ({pace}; kept above {1 + POOL_MARGIN:.2f}x "
               f"in most pairs)")
        changed, self.own_pool = self.own_pool != own, own
        self._pool_windows, self._pool_decided = [], True
        rates = [r for pool, r in trial if pool == own]
        self._settle(sum(rates) / len(rates), why)
        return changed

    def _watch(self, rate: float, empty: float) -> bool:
        """After settling: re-opens the search when the input became the bound at a new pace.

        Only a window in which the buffer ran empty counts: with batches waiting, the rate is the step's
        (a slower model step, an evaluation, a checkpoint, a pause between loops), and more or fewer
        lanes would not change it. Re-opening on those windows made the tuner wander off a good
        setting after every pause.
        """
        base = self._settled_rate or rate
        if empty < EMPTY_FRACTION or abs(rate - base) <= base * RETUNE_MARGIN:
            self._moved_windows = 0
            return False
        self._moved_windows += 1
        if self._moved_windows < RETUNE_WINDOWS:  # one odd window on a busy machine is noise
            return False
        self._moved_windows = 0
        logger.info("stage %s: the input is the bound at %.1f batches/s (was %.1f); tuning again",
                    self.stage, rate, base)
        self.mode, self._best = Mode.CLIMBING, None
        self.reason = "the input became the bound; measuring again"
        if self.tune_pool:  # the pool is tried again once the lanes settle at the new pace
            self._pool_decided, self.own_pool = False, False
        return self._change(1 if self.tune_num_threads else self.num_threads, self.capacity, self.reason)
