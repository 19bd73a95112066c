"""The prefetch side's own inter-op pool: made at session creation, chosen (or not) by AUTOTUNE.

    before:  ConfigProto()                      # one inter-op pool: prefetch runs and steps share it
    after:   with_prefetch_pool(ConfigProto())  # pool 0: the steps (as before), pool 1: prefetch runs may use it

TensorFlow fixes a session's inter-op pools when the session is made, and a run picks one with
`RunOptions.inter_op_thread_pool`. So a pool the tuner may try must exist from the start: the sessions
SmartStage makes (ss.Session, ss.MonitoredTrainingSession, the compat session creators) get two when the
user's config lists none: pool 0 for everything that does not ask (the steps), sized as the config's
`inter_op_parallelism_threads` (0: one thread per core, TensorFlow's default), and pool 1 for prefetch
runs, half the cores (at least 1). Both are process-wide (`global_name`), as TensorFlow's default pool
is, so a second session reuses them. A stage whose pool is AUTOTUNE runs on the shared pool 0 and tries
pool 1 (runtime/lanes/tuning/autotune.py). A user's own pools are kept as they are (the last one is then the one
tried); a distributed session (a server target) gets none: TensorFlow refuses pool options there.
"""

from __future__ import annotations

import os

from tensorflow.core.protobuf import config_pb2

from smartstage.errors import StageRuntimeError
from smartstage.runtime.stage.settings import StageSettings

MAIN_POOL = 0


def prefetch_pool_threads() -> int:
    """Threads of the prefetch pool SmartStage adds: half the cores, at least one."""
    return max(1, (os.cpu_count() or 1) // 2)


def is_local_target(target) -> bool:
    """Whether a session on `target` runs in this process (DirectSession): only those take pool options."""
    if isinstance(target, bytes):
        target = target.decode()
    return not (target or "").strip()


def with_prefetch_pool(config: config_pb2.ConfigProto | None, target=None) -> config_pb2.ConfigProto | None:
    """`config` with a main and a prefetch inter-op pool added when it lists none (a copy; `config` is kept).

        before:  ConfigProto(inter_op_parallelism_threads=4)
        after:   ConfigProto(session_inter_op_thread_pool=[{num_threads: 4, global_name: "smartstage_main_4"},
                                                           {num_threads: 1, global_name: "smartstage_prefetch_1"}])

    Unchanged: a config that already lists pools, asks for per-session threads, or a remote `target`.
    """
    if not is_local_target(target):
        return config
    if config is not None and (config.session_inter_op_thread_pool or config.use_per_session_threads):
        return config
    result = config_pb2.ConfigProto()
    if config is not None:
        result.CopyFrom(config)
    main = result.inter_op_parallelism_threads
    prefetch = prefetch_pool_threads()
    result.session_inter_op_thread_pool.add(num_threads=main, global_name=f"smartstage_main_{main}")
    result.session_inter_op_thread_pool.add(num_threads=prefetch, global_name=f"smartstage_prefetch_{prefetch}")
    return result


def tunable_pool(config: config_pb2.ConfigProto | None) -> int | None:
    """The pool a stage whose pool is AUTOTUNE may try (the session's last one), or None when it has one pool."""
    pools = len(config.session_inter_op_thread_pool) if config is not None else 0
    return pools - 1 if pools >= 2 else None


def stage_pools(settings: StageSettings, config: config_pb2.ConfigProto | None,
                remote: bool) -> tuple[dict[bool, config_pb2.RunOptions], bool, str]:
    """A stage's prefetch run options per pool (False: the shared one, True: its own), whether AUTOTUNE may
    try its own, and why not when its pool is AUTOTUNE but cannot be tried.

        before:  StageSettings(tune_pool=True, ...), a session from with_prefetch_pool()
        after:   ({False: RunOptions(), True: RunOptions(inter_op_thread_pool=1)}, True, "")
    """
    options = {False: config_pb2.RunOptions()}
    if settings.tune_pool:
        own = tunable_pool(config)
        if own is None:
            return options, False, ("shared pool: the session has one inter-op pool (sessions SmartStage makes get "
                                    "a prefetch pool; give a plain Session two session_inter_op_thread_pool entries)")
        if not settings.ordered or remote:
            return options, False, "shared pool: the pool is tuned for ordered stages in this process only"
        options[True] = config_pb2.RunOptions(inter_op_thread_pool=own)
        return options, True, ""
    if settings.pool is not None:
        options[True] = config_pb2.RunOptions(inter_op_thread_pool=settings.pool)
    return options, False, ""


def explicit_pool_threads(settings: StageSettings, config: config_pb2.ConfigProto | None) -> int | None:
    """Threads of the pool a stage's prefetch runs are pinned to (use_stage_subgraph_thread_pool=True with an
    index); None when they may use the shared pool. A prefetch run holds a pool thread while it runs or waits,
    so lanes beyond this many cannot run at once: AUTOTUNE does not try them (explicit num_threads stay)."""
    pool_id = settings.pool
    if pool_id is None or config is None:
        return None
    if pool_id >= len(config.session_inter_op_thread_pool):
        return None  # check_stage_pool names the missing pool
    return config.session_inter_op_thread_pool[pool_id].num_threads or os.cpu_count() or 1


def check_stage_pool(settings: StageSettings, config: config_pb2.ConfigProto | None) -> None:
    """Raises StageRuntimeError when a stage asks for a pool index the session does not have."""
    pool_id = settings.pool
    if pool_id is None:
        return
    pools = len(config.session_inter_op_thread_pool) if config is not None else 0
    if pool_id >= pools:
        raise StageRuntimeError(
            f"stage '{settings.name}' runs its prefetch on inter-op thread pool {pool_id} "
            f"(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id={pool_id}), but the "
            f"session has {pools} session_inter_op_thread_pool entries. Create the session with a "
            f"ConfigProto listing at least {pool_id + 1} pools, e.g. "
            "tf.compat.v1.ConfigProto(session_inter_op_thread_pool=[config_pb2.ThreadPoolOptionProto("
            "num_threads=0), config_pb2.ThreadPoolOptionProto(num_threads=1)]) with config_pb2 from "
            "tensorflow.core.protobuf (pool 0 runs the training step, pool 1 the prefetch runs), "
            "or build the stage with use_stage_subgraph_thread_pool=False"
        )


__all__ = ["MAIN_POOL", "check_stage_pool", "explicit_pool_threads", "is_local_target", "prefetch_pool_threads",
           "stage_pools", "tunable_pool", "with_prefetch_pool"]
