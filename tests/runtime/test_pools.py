"""The prefetch side's own inter-op pool (runtime/lanes/tuning/pools.py) and AUTOTUNE's choice of it (runtime/lanes/tuning/autotune.py).

    ss.Session(config)  ->  ConfigProto(session_inter_op_thread_pool=[main pool 0, prefetch pool 1])
    staged(x)           ->  use_stage_subgraph_thread_pool=AUTOTUNE: lanes settle first, then (own, shared)
                            window pairs alternate, and the own pool is kept only when it wins most pairs
                            and the median pair by more than POOL_MARGIN
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage as ssp
import smartstage.runtime as ss
from smartstage.runtime.lanes.tuning import autotune
from smartstage.runtime.stage.settings import AUTOTUNE, StageSettings
from smartstage.runtime.lanes.tuning.autotune import POOL_PAIRS, Tuner
from smartstage.runtime.lanes.tuning.meter import Window
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.runtime.lanes.tuning.pools import prefetch_pool_threads, tunable_pool, with_prefetch_pool
from tests.runtime.helpers import BOUND_SECONDS, bounded, lanes_config, range_input


def test_a_config_without_pools_gets_a_main_and_a_prefetch_pool():
    config = config_pb2.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=2)
    got = with_prefetch_pool(config)
    assert [(p.num_threads, p.global_name) for p in got.session_inter_op_thread_pool] == [
        (4, "smartstage_main_4"), (prefetch_pool_threads(), f"smartstage_prefetch_{prefetch_pool_threads()}")]
    assert got.intra_op_parallelism_threads == 2              # every other field kept
    assert not config.session_inter_op_thread_pool            # the caller's config is not edited
    assert len(with_prefetch_pool(None).session_inter_op_thread_pool) == 2
    assert tunable_pool(got) == 1 and tunable_pool(config) is None and tunable_pool(None) is None


@pytest.mark.parametrize("config, target", [
    (config_pb2.ConfigProto(session_inter_op_thread_pool=[config_pb2.ThreadPoolOptionProto(num_threads=3)]), ""),
    (config_pb2.ConfigProto(use_per_session_threads=True), ""),
    (config_pb2.ConfigProto(), "grpc://localhost:2222"),
    (config_pb2.ConfigProto(), b"grpc://localhost:2222"),
])
def test_pools_the_user_chose_and_remote_sessions_are_left_alone(config, target):
    assert with_prefetch_pool(config, target) is config


def _window() -> Window:
    return Window(started=0.0, batches=30, empty=0)


def _settle_lanes(tuner: Tuner) -> None:
    """Two windows with the buffer filled: one lane is enough; the pool trial starts on the own pool."""
    tuner.observe(_window(), 50.0, 100)
    assert tuner.observe(_window(), 50.0, 100) and tuner.own_pool and not tuner.settled
    assert not tuner.observe(_window(), 10.0, 100)           # the first own-pool window makes its executors


def _pool_trial(tuner: Tuner, own_rate: float, shared_rate: float) -> list[bool]:
    pools = []
    for _ in range(POOL_PAIRS):
        for rate in (own_rate, shared_rate):
            pools.append(tuner.own_pool)
            tuner.observe(_window(), rate, 100)
    return pools


def test_the_own_pool_is_kept_when_it_wins():
    tuner = Tuner("s", 1, 2, True, False, max_threads=4, max_buffered_bytes=10**9, tune_pool=True)
    _settle_lanes(tuner)
    assert _pool_trial(tuner, 60.0, 50.0) == [True, False] * POOL_PAIRS   # alternating, own first
    assert tuner.settled and tuner.own_pool and tuner.num_threads == 1
    decision = tuner.decision()
    assert decision.own_pool and [p for p, _ in decision.pool_tried] == [True, False] * POOL_PAIRS
    assert "own pool" in decision.reason and "1.20x" in decision.reason


@pytest.mark.parametrize("own_rate", [50.0, 51.0, 40.0])   # equal, inside the margin, slower
def test_the_shared_pool_stays_unless_the_own_one_wins_by_the_margin(own_rate):
    tuner = Tuner("s", 1, 2, True, False, max_threads=4, max_buffered_bytes=10**9, tune_pool=True)
    _settle_lanes(tuner)
    _pool_trial(tuner, own_rate, 50.0)
    assert tuner.settled and not tuner.own_pool and "shared pool" in tuner.reason


def test_explicit_lanes_and_capacity_still_try_the_pool():
    tuner = Tuner("s", 3, 5, False, False, max_threads=3, max_buffered_bytes=10**9, tune_pool=True)
    assert not tuner.settled
    tuner.observe(_window(), 50.0, 100)                        # start-up window
    assert tuner.observe(_window(), 50.0, 100) and tuner.own_pool
    tuner.observe(_window(), 50.0, 100)
    _pool_trial(tuner, 70.0, 50.0)
    assert tuner.settled and tuner.own_pool and (tuner.num_threads, tuner.capacity) == (3, 5)


def test_a_reopened_search_tries_the_pool_again():
    tuner = Tuner("s", 1, 2, True, False, max_threads=4, max_buffered_bytes=10**9, tune_pool=True)
    _settle_lanes(tuner)
    _pool_trial(tuner, 60.0, 50.0)
    assert tuner.settled and tuner.own_pool
    empty = Window(started=0.0, batches=30, empty=30)
    tuner.observe(empty, 20.0, 100)                            # the window right after settling is skipped
    for _ in range(3):                                         # the input became the bound at a new pace
        tuner.observe(empty, 20.0, 100)
    assert not tuner.settled and not tuner.own_pool            # measuring again, from the shared pool


def test_ss_session_gives_the_stage_a_pool_to_try_and_keeps_every_batch_in_order(graph, monkeypatch):
    """A session SmartStage makes has the prefetch pool; AUTOTUNE tries it while training, batches in order."""
    monkeypatch.setattr(autotune, "POOL_WINDOW_SECONDS", 0.3)
    x = range_input(10**6)
    y = ss.staged(tf.identity(x * 2, name="body"))
    (stage,) = stage_defs(graph)
    assert stage.stage_subgraph_thread_pool_id == AUTOTUNE      # the default, recorded in the StageDef
    with ssp.Session(graph=graph, config=lanes_config()) as sess:   # the stage on lanes, not folded
        assert tunable_pool(sess._config) == 1
        got, deadline = [], time.monotonic() + BOUND_SECONDS
        while time.monotonic() < deadline:
            got.append(int(sess.run(y, options=bounded())))
            (decision,) = sess.prefetch_threads.decisions()
            if decision.settled and decision.pool_tried:
                break
    assert got == [2 * i for i in range(len(got))]
    assert decision.settled and len(decision.pool_tried) == 2 * POOL_PAIRS, decision
    assert [own for own, _ in decision.pool_tried] == [True, False] * POOL_PAIRS
    assert ("own pool" in decision.reason) == decision.own_pool


def test_a_plain_session_with_one_pool_keeps_the_shared_pool(graph):
    y = ss.staged(range_input(100) * 3)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess) as threads:
        got = [int(sess.run(y, options=bounded())) for _ in range(100)]
        (stats,) = threads.stats()
        tuner = threads._stages[0].tuner
    np.testing.assert_array_equal(got, np.arange(100) * 3)
    assert not stats.own_pool and not tuner.tune_pool and "one inter-op pool" in tuner.pool_note


@pytest.mark.parametrize("stage, config, ordered, remote, expected", [
    # stage's pool                                        session pools  ordered remote  own pool, tried, why-not
    (dict(stage_subgraph_thread_pool_id=AUTOTUNE),                    2, True,  False, (1, True, "")),
    (dict(stage_subgraph_thread_pool_id=AUTOTUNE),                    1, True,  False, (None, False, "one inter-op pool")),
    (dict(stage_subgraph_thread_pool_id=AUTOTUNE),                    2, False, False, (None, False, "ordered stages")),
    (dict(stage_subgraph_thread_pool_id=AUTOTUNE),                    2, True,  True,  (None, False, "in this process")),
    (dict(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1), 2, True, False, (1, False, "")),
    (dict(use_stage_subgraph_thread_pool=False),                      2, True,  False, (None, False, "")),
])
def test_stage_pools(stage, config, ordered, remote, expected):
    from smartstage.protos.stage_pb2 import StageDef
    from smartstage.runtime.lanes.tuning.pools import stage_pools
    proto = config_pb2.ConfigProto(session_inter_op_thread_pool=[config_pb2.ThreadPoolOptionProto()] * config)
    settings = StageSettings.from_def(StageDef(name="s", unordered=not ordered, **stage))
    options, tried, why = stage_pools(settings, proto, remote)
    own, expected_tried, expected_why = expected
    assert options[False] == config_pb2.RunOptions()
    assert (options[True].inter_op_thread_pool if True in options else None) == own
    assert tried == expected_tried and expected_why in why and bool(why) == bool(expected_why)


def test_a_missing_pool_index_is_one_error_naming_the_fix():
    from smartstage.errors import StageRuntimeError
    from smartstage.protos.stage_pb2 import StageDef
    from smartstage.runtime.lanes.tuning.pools import check_stage_pool
    stage = StageDef(name="s", use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1)
    with pytest.raises(StageRuntimeError, match=r"stage 's'.*pool 1.*has 1 session_inter_op_thread_pool"):
        check_stage_pool(StageSettings.from_def(stage),
                         config_pb2.ConfigProto(session_inter_op_thread_pool=[config_pb2.ThreadPoolOptionProto()]))
    check_stage_pool(StageSettings.from_def(stage), with_prefetch_pool(None))   # two pools: fine


def test_autotune_tries_no_more_lanes_than_a_pinned_pool_has_threads(graph):
    """use_stage_subgraph_thread_pool=True on a 1-thread pool: a latency-bound body (best with many lanes
    on the shared pool) stays at one lane, since lanes on one pool thread cannot overlap."""
    from smartstage.runtime.lanes.tuning.pools import explicit_pool_threads
    x = range_input(10**6)
    body = tf.numpy_function(lambda v: (time.sleep(0.01), v)[1], [x], tf.int64, stateful=False)
    y = ss.staged(body, use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1)
    config = config_pb2.ConfigProto(session_inter_op_thread_pool=[
        config_pb2.ThreadPoolOptionProto(num_threads=2), config_pb2.ThreadPoolOptionProto(num_threads=1)])
    (stage,) = stage_defs(graph)
    assert explicit_pool_threads(StageSettings.from_def(stage), config) == 1
    with tf.compat.v1.Session(graph=graph, config=config) as sess, ss.start_prefetch_threads(sess) as threads:
        got = [int(sess.run(y, options=bounded())) for _ in range(150)]
        tuner = threads._stages[0].tuner
    assert got == list(range(150))
    assert tuner.max_threads == 1 and not tuner.tune_num_threads and tuner.num_threads == 1
