"""The one door to the lanes: the only module that imports smartstage.runtime.lanes, and only when called.

    before:  every stage folded into its dataset         lanes_stages(graph) == []: nothing imported, no thread
    after:   a stage survives the passes unfolded         lanes_stages(graph) == [it]: the room is imported here

A stage folded into its tf.data pipeline has left the graph's StageDef collection, so the stages still in it
are exactly the ones whose buffer a SmartStage thread must fill. Whoever starts prefetch threads asks
lanes_stages() first and goes through this module only for a stage it returns; the lanes room (its producers,
tuning, pools and lane graphs) is then imported on that first call. Importing this module imports nothing of
the room (tests/test_layers.py: no other module of the package imports it; tests/runtime/test_lanes_door.py:
a session whose stages all folded runs with the room absent from sys.modules).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Iterable

import tensorflow as tf

from smartstage.protos.stage_pb2 import StageDef
from smartstage.runtime.stage.metadata import stage_defs
from smartstage.runtime.stage.settings import STOP_JOIN_SECONDS

if TYPE_CHECKING:
    from tensorflow.core.protobuf import config_pb2

    from smartstage.runtime.lanes.producers.prefetch_threads import PrefetchThreads
    from smartstage.runtime.lanes.tuning.autotune import PipelineStats, TuningDecision

ROOM = "smartstage.runtime.lanes"


def lanes_stages(graph: tf.Graph, stages: Iterable[StageDef | str] | None = None) -> list[StageDef]:
    """The stages of `graph` that run on lanes (all of them, or those of `stages` by def or name): the ones
    the passes left unfolded. Reads the graph's collection only; imports nothing.

        before:  staged(parse(iterator.get_next())) folded by the session      -> []
        after:   staged(reader.read()) (a queue reader: tf.data cannot hold it) -> [its StageDef]
    """
    known = stage_defs(graph)
    if stages is None:
        return known
    names = {s.name if isinstance(s, StageDef) else s for s in stages}
    return [d for d in known if d.name in names]


def prepare_lanes(graph: tf.Graph, stages: list[StageDef]) -> None:
    """Builds the lanes of `stages` into `graph` (before it is finalized); with no stage, imports nothing."""
    if not stages:
        return
    from smartstage.runtime.lanes.remote import prepare_all_lanes

    prepare_all_lanes(graph, stages)


def start_prefetch_threads(sess, coord: tf.train.Coordinator | None = None,
                           stages: Iterable[StageDef | str] | None = None) -> PrefetchThreads:
    """Starts the prefetch threads of the stages in `sess.graph` (or of `stages`, by def or name) on their lanes.

    `sess` is a plain `tf.compat.v1.Session`; with a MonitoredTrainingSession use `make_prefetch_hook()`
    instead. With `coord`, an unexpected error stops the coordinator, and the coordinator stopping stops
    the threads (runtime/lanes/producers/prefetch_threads.py).

        before:  sess.run(features)   # InvalidArgumentError: stage 'stage' has no prefetch threads
        after:   with start_prefetch_threads(sess): sess.run(features)
    """
    from smartstage.runtime.lanes.producers.prefetch_threads import start_prefetch_threads as start

    return start(sess, coord=coord, stages=stages)


def latest_prefetch_threads(graph: tf.Graph) -> PrefetchThreads | None:
    """The prefetch threads most recently started for `graph`'s stages (None: none, or they stopped; without
    importing the room when no lane ever ran in this process)."""
    if ROOM not in sys.modules:
        return None
    from smartstage.runtime.lanes.producers.prefetch_threads import latest_prefetch_threads as latest

    return latest(graph)


def with_prefetch_pool(config: config_pb2.ConfigProto | None, target=None) -> config_pb2.ConfigProto | None:
    """`config` with the prefetch inter-op pool a lanes stage's AUTOTUNE may try (runtime/lanes/tuning/pools.py)."""
    from smartstage.runtime.lanes.tuning.pools import with_prefetch_pool as with_pool

    return with_pool(config, target)


ROOM_NAMES = ("PipelineStats", "PrefetchThreads", "TuningDecision")


def room_attribute(name: str):
    """A public name of the room (one of ROOM_NAMES), importing the room on this use."""
    from smartstage.runtime.lanes.producers import prefetch_threads

    return getattr(prefetch_threads, name)


def __getattr__(name: str):
    if name in ROOM_NAMES:
        return room_attribute(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PipelineStats", "PrefetchThreads", "ROOM", "ROOM_NAMES", "STOP_JOIN_SECONDS", "TuningDecision",
           "latest_prefetch_threads", "lanes_stages", "prepare_lanes", "room_attribute", "start_prefetch_threads",
           "with_prefetch_pool"]
