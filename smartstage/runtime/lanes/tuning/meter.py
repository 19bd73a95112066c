"""What a stage's producer measures, per batch and per window, for the tuner and the pipeline hook.

    before:  a producer moves batches into the buffer, unmeasured
    after:   meter.produced(head, body); meter.moved(wait, occupancy); meter.close_window(now) -> Window

Per batch: the head's and the body's time on the prefetch side, how long the move into the buffer waited
for room (the producer waiting for the step), the buffer's occupancy right after the move, and the bytes
of a batch; per window: batches per second. The Tuner (autotune.py) judges finished windows.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

WINDOW_BATCHES = 24
WINDOW_SECONDS = 0.3


@dataclass
class Window:
    """One measurement window of a stage: batches moved and what they cost (StageMeter sums, Tuner judges)."""

    started: float = field(default_factory=time.monotonic)
    batches: int = 0
    head: float = 0.0
    body: float = 0.0
    wait: float = 0.0
    occupancy: int = 0
    empty: int = 0
    first: int | None = None  # the buffer's occupancy right after the window's first move ...
    last: int | None = None   # ... and after its last one

    def rate(self, now: float) -> float:
        return self.batches / max(now - self.started, 1e-9)

    def filling(self) -> bool:
        """Whether the step took fewer than half the batches moved (the buffer grew by more): the buffer
        fills ahead of a step that idles (a restore, the first step's executors, a pause), which says
        nothing of which side sets the pace."""
        if self.first is None or self.last is None:
            return False
        return 2 * (self.last - self.first + 1) > self.batches


class StageMeter:
    """Per-batch measurements of one stage, summed per window (thread-safe, cheap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.window = Window()
        self.last: Window | None = None
        self.last_rate = 0.0
        self.total = 0
        self.batch_bytes = 0
        self.step_times: list[float] = []

    def produced(self, head: float, body: float) -> None:
        with self._lock:
            self.window.head += head
            self.window.body += body

    def moved(self, wait: float, occupancy: int | None) -> None:
        with self._lock:
            self.window.batches += 1
            self.total += 1
            self.window.wait += wait
            if occupancy is not None:
                w = self.window
                w.occupancy += occupancy
                w.empty += occupancy <= 1
                w.first = occupancy if w.first is None else w.first
                w.last = occupancy

    def seconds_per_batch(self) -> float:
        """The pace of the last window (0.0 before one closed): about one training step when the buffer is full."""
        rate = self.last_rate
        return 1.0 / rate if rate > 0 else 0.0

    def bytes_seen(self, value: int) -> None:
        self.batch_bytes = max(self.batch_bytes, int(value))

    def step_timed(self, seconds: float) -> None:
        """One training step's time (the prefetch hook calls this)."""
        with self._lock:
            self.step_times.append(seconds)
            del self.step_times[:-WINDOW_BATCHES]

    def summary(self) -> dict:
        """The last finished window (the current one before any finished), per batch."""
        with self._lock:
            w = self.last if self.last is not None else self.window
            n = max(w.batches, 1)
            rate = self.last_rate if self.last is not None else w.rate(time.monotonic())
            steps = list(self.step_times)
        return dict(batches=self.total, batches_per_second=rate, occupancy=w.occupancy / n,
                    empty_fraction=w.empty / n, producer_wait_seconds=w.wait / n,
                    step_seconds=sum(steps) / len(steps) if steps else None,
                    head_seconds=w.head / n, body_seconds=w.body / n, batch_bytes=self.batch_bytes)

    def window_full(self, now: float, seconds: float = WINDOW_SECONDS) -> bool:
        w = self.window
        return w.batches >= WINDOW_BATCHES and now - w.started >= seconds

    def close_window(self, now: float) -> Window:
        with self._lock:
            done, self.window = self.window, Window(started=now)
            self.last, self.last_rate = done, done.rate(now)
            return done


__all__ = ["WINDOW_BATCHES", "WINDOW_SECONDS", "StageMeter", "Window"]
