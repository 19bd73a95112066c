"""A StageDef's settings as the runtime reads them (runtime/stage/settings.py), and where lane ops get built.

StageSettings.from_def resolves the AUTOTUNE marker (-1) once; the table below writes every case out.
StageThreads builds no op when it is made: prepare() (called by PrefetchThreads.start()) is the one step
that adds the lanes.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage.runtime as ss
from smartstage.errors import StageRuntimeError
from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.lanes.producers.prefetch_threads import PrefetchThreads
from smartstage.runtime.stage.settings import (AUTOTUNE, AUTOTUNE_START_CAPACITY, DEFAULT_MAX_BUFFERED_BYTES,
                                              StageSettings)
from tests.runtime.helpers import bounded, range_input

A, S, D = AUTOTUNE, AUTOTUNE_START_CAPACITY, DEFAULT_MAX_BUFFERED_BYTES


@pytest.mark.parametrize("fields, expected", [
    # StageDef fields                                          lanes tune   cap tune  pool  tune  bytes ordered
    (dict(num_threads=A, capacity=A, stage_subgraph_thread_pool_id=A),
     (1, True, S, True, None, True, D, True)),
    (dict(num_threads=4, capacity=8),                          (4, False, 8, False, None, False, D, True)),
    (dict(num_threads=0, capacity=1),                          (1, False, 1, False, None, False, D, True)),
    (dict(num_threads=3, capacity=2, unordered=True),          (3, False, 2, False, None, False, D, False)),
    (dict(num_threads=2, capacity=A, max_buffered_bytes=1000), (2, False, S, True, None, False, 1000, True)),
    (dict(num_threads=1, capacity=1, use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1),
     (1, False, 1, False, 1, False, D, True)),
    (dict(num_threads=1, capacity=1, use_stage_subgraph_thread_pool=False, stage_subgraph_thread_pool_id=1),
     (1, False, 1, False, None, False, D, True)),
    (dict(num_threads=1, capacity=1, use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=A),
     (1, False, 1, False, None, True, D, True)),
])
def test_from_def_resolves_the_autotune_marker_once(fields, expected):
    s = StageSettings.from_def(StageDef(name="s", **fields))
    assert (s.num_threads, s.tune_num_threads, s.capacity, s.tune_capacity, s.pool, s.tune_pool, s.max_buffered_bytes,
            s.ordered) == expected
    assert s.name == "s"
    assert s.tuned == tuple(n for n, t in (("num_threads", s.tune_num_threads), ("capacity", s.tune_capacity),
                                           ("pool", s.tune_pool)) if t)


def test_settings_are_frozen():
    s = StageSettings.from_def(StageDef(name="s", num_threads=2, capacity=2))
    with pytest.raises(AttributeError):
        s.num_threads = 3  # type: ignore[misc]


def _lane_ops(graph: tf.Graph) -> list[str]:
    return [op.name for op in graph.get_operations() if "/lanes/" in op.name]


def test_the_thread_owners_build_no_op_when_made_and_start_builds_the_lanes(graph):
    y = ss.staged(tf.identity(range_input(1000) * 2), capacity=2, num_threads=2)
    with tf.compat.v1.Session(graph=graph) as sess:
        ops_before = len(graph.get_operations())
        threads = PrefetchThreads(sess, ss.stage_defs(graph))
        assert len(graph.get_operations()) == ops_before          # made: nothing built
        (stage,) = threads._stages                                 # noqa: SLF001
        assert stage.lanes is None and not stage.prepared
        with threads.start():                                      # prepare() builds two lanes, then threads run
            assert stage.prepared and len(stage.lanes.lanes) == 2 and _lane_ops(graph)
            assert [int(sess.run(y, options=bounded())) for _ in range(5)] == [0, 2, 4, 6, 8]


def test_a_stage_started_before_prepare_names_the_fix(graph):
    ss.staged(range_input(10), capacity=2, num_threads=2)
    with tf.compat.v1.Session(graph=graph) as sess:
        (stage,) = PrefetchThreads(sess, ss.stage_defs(graph))._stages  # noqa: SLF001
        with pytest.raises(StageRuntimeError, match="prepare"):
            stage.start()
        assert _lane_ops(graph) == []
