"""What a producer may ask of its stage, and what a stage may ask of the threads that own it.

    before:  OrderedProducer(stage: StageThreads, ...)   # and stage_threads.py imports ordered.py: a circle
    after:   OrderedProducer(host: ProducerHost, ...)    # StageThreads is one ProducerHost; no circle

The three producers (unordered.py, ordered.py, sharded.py) fill one stage's buffer. They reach the stage
only through `ProducerHost`: its op handles, its run options, the error policy and the lifecycle flags.
`StageThreads` (stage_threads.py) implements it and `PrefetchThreads` (prefetch_threads.py) implements
`Owner`. Both are Protocols, so neither module imports the other's class.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from smartstage.runtime.lanes.remote import RemotePlan
from smartstage.runtime.stage.settings import StageSettings
from smartstage.runtime.lanes.tuning.autotune import Tuner
from smartstage.runtime.lanes.tuning.meter import StageMeter


class Owner(Protocol):
    """What a stage's threads ask of the PrefetchThreads that own them."""

    def stopping(self) -> bool: ...

    def report_error(self, stage: "ProducerHost", error: BaseException) -> None: ...

    def defer_error(self, stage: "ProducerHost", error: BaseException) -> None: ...


class ProducerHost(Protocol):
    """One stage as its producer sees it (StageThreads).

    The error kinds `classify` returns: shutdown, closed (end of input), ignored, cancelled, uninitialized,
    unexpected. `finish` ends an ordered producer at an error, every earlier batch being buffered;
    `fail_in_order` reports an unexpected error once the step took the batches before it.
    """

    name: str
    sess: object
    settings: StageSettings
    put: tf.Operation
    size: tf.Tensor | None
    feed_values: list[tf.Tensor]
    closed_codes: set[int]
    remote: RemotePlan | None
    tuner: Tuner
    meter: StageMeter

    @property
    def run_options(self) -> config_pb2.RunOptions: ...

    @property
    def body_run_options(self) -> config_pb2.RunOptions: ...

    def stopping(self) -> bool: ...

    def paused(self) -> bool: ...

    def halted(self) -> bool: ...

    def feed_dict(self) -> dict | None: ...

    def control_run(self, fetch): ...

    def in_flight(self, index: int | None) -> contextlib.AbstractContextManager[None]: ...

    def classify(self, error: BaseException) -> str: ...

    def finish(self, error: BaseException, deferred: bool) -> None: ...

    def fail_in_order(self, error: BaseException) -> None: ...

    def lane_error(self, error: BaseException, lane: int) -> BaseException: ...

    def close_buffer(self, why: str = "") -> None: ...

    def wait_for_initializer(self, index: int) -> None: ...


__all__ = ["Owner", "ProducerHost"]
