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
pool 1 (runtime/autotune.py). A user's own pools are kept as they are (the last one is then the one
tried); a distributed session (a server target) gets none: TensorFlow refuses pool options there.
"""

from __future__ import annotations

import os

from tensorflow.core.protobuf import config_pb2

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


__all__ = ["MAIN_POOL", "is_local_target", "prefetch_pool_threads", "tunable_pool", "with_prefetch_pool"]
