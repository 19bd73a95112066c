"""A stage's settings as the runtime reads them: the AUTOTUNE marker of its StageDef resolved once.

    before:  stage_def.num_threads == -1, stage_def.capacity == 4, stage_def.stage_subgraph_thread_pool_id == -1
    after:   StageSettings(num_threads=1, tune_num_threads=True, capacity=4, tune_capacity=False, pool=None,
                           tune_pool=True, ...)

`staged()` records AUTOTUNE as -1 in the StageDef (the proto is the seam between graph construction, the
optimizer and the session). Everything in the runtime reads a `StageSettings` made from it by
`StageSettings.from_def`, never the -1 itself, as tf.data's `SharedState` decides `tunable` once at
construction. `num_threads` is the number of prefetch threads (ordered: lanes, one thread each) a stage
starts with, under the name staged() and the StageDef give it.
"""

from __future__ import annotations

from dataclasses import dataclass

from smartstage.protos import AUTOTUNE  # like tf.data.AUTOTUNE: "the runtime chooses"; -1 in the StageDef
from smartstage.protos.stage_pb2 import StageDef

DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
AUTOTUNE_START_CAPACITY = 2  # a tuned capacity starts here and grows while the buffer runs dry
# Seconds a session's close() (and a stage's pause or stop) waits for its prefetch threads to end.
STOP_JOIN_SECONDS = 10.0


@dataclass(frozen=True)
class StageSettings:
    """One stage's num_threads, capacity and pool, each either explicit or tuned (AUTOTUNE), and its byte cap.

    num_threads / capacity: the values in force at the start (the tuner's start values when tuned).
    pool: the inter-op pool index the prefetch runs are pinned to (use_stage_subgraph_thread_pool=True with
        an index); None: the session's shared pool (or, with tune_pool, the shared pool until the tuner tries
        the session's prefetch pool).
    """

    name: str
    ordered: bool
    num_threads: int
    tune_num_threads: bool
    capacity: int
    tune_capacity: bool
    pool: int | None
    tune_pool: bool
    max_buffered_bytes: int

    @classmethod
    def from_def(cls, stage_def: StageDef) -> "StageSettings":
        """The settings a StageDef records, with AUTOTUNE (-1) turned into the tune_* flags.

            before:  StageDef(name="s", num_threads=-1, capacity=8, use_stage_subgraph_thread_pool=True,
                              stage_subgraph_thread_pool_id=1)
            after:   StageSettings("s", ordered=True, num_threads=1, tune_num_threads=True, capacity=8,
                                   tune_capacity=False, pool=1, tune_pool=False,
                                   max_buffered_bytes=DEFAULT_MAX_BUFFERED_BYTES)
        """
        tune_num_threads = stage_def.num_threads == AUTOTUNE
        tune_capacity = stage_def.capacity == AUTOTUNE
        tune_pool = stage_def.stage_subgraph_thread_pool_id == AUTOTUNE
        pinned = bool(stage_def.use_stage_subgraph_thread_pool) and not tune_pool
        return cls(
            name=stage_def.name,
            ordered=not stage_def.unordered,
            num_threads=1 if tune_num_threads else max(int(stage_def.num_threads), 1),
            tune_num_threads=tune_num_threads,
            capacity=AUTOTUNE_START_CAPACITY if tune_capacity else int(stage_def.capacity),
            tune_capacity=tune_capacity,
            pool=int(stage_def.stage_subgraph_thread_pool_id) if pinned else None,
            tune_pool=tune_pool,
            max_buffered_bytes=int(stage_def.max_buffered_bytes) or DEFAULT_MAX_BUFFERED_BYTES,
        )

    @property
    def tuned(self) -> tuple[str, ...]:
        """The settings AUTOTUNE picks, by name: a subset of ("num_threads", "capacity", "pool")."""
        return tuple(name for name, tuned in (("num_threads", self.tune_num_threads), ("capacity", self.tune_capacity),
                                              ("pool", self.tune_pool)) if tuned)


__all__ = ["AUTOTUNE", "AUTOTUNE_START_CAPACITY", "DEFAULT_MAX_BUFFERED_BYTES", "StageSettings"]
