"""What a checkpoint restore gives a stage that runs on lanes: the iterator's position, not the buffer.

    before:  staged(parse(iterator.get_next()))  on lanes, iterator in SAVEABLE_OBJECTS: a restore silently
             skips the batches the buffer and the lanes held when the checkpoint was written
    after:   WARNING stage 'stage' runs on lanes and reads iterator 'Iterator', whose position is checkpointed ...

A stage whose source tf.data cannot carry (queue readers, fed inputs, input tasks) or that was asked to stay on
lanes (tf_data_stage="lanes") runs its prefetch side ahead of the step, as stock queues do. When its prefetch
side reads an iterator whose state a Saver saves (make_saveable_from_iterator, in SAVEABLE_OBJECTS), the saved
position is past the batches waiting in the buffer, and a restore does not train them. Folded stages
(passes/fold_dataset.py) restore exactly: tf.data's own buffer is saved with the position. Warned once per
stage and iterator in a process.
"""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

from smartstage.graph.op_types import ITERATOR_READS
from smartstage.protos.stage_pb2 import StageDef

logger = logging.getLogger(__name__)

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def saved_iterators(graph: tf.Graph) -> set[str]:
    """The iterator ops whose state the graph's SAVEABLE_OBJECTS save (make_saveable_from_iterator).

        before:  add_to_collection(SAVEABLE_OBJECTS, make_saveable_from_iterator(iterator))
        after:   {"IteratorV2"}
    """
    names = set()
    for saveable in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
        op = getattr(saveable, "op", None)
        op = getattr(op, "op", op)  # the saveable holds the iterator's resource tensor
        if isinstance(op, tf.Operation):
            names.add(op.name)
    return names


def iterators_read(put: tf.Operation) -> list[str]:
    """The iterator ops `put`'s prefetch side reads (through IteratorGetNext), sorted by name.

        before:  IteratorV2 -> IteratorGetNext -> parse -> stage/put
        after:   ["IteratorV2"]
    """
    seen, todo, found = {put.name}, [put], []
    while todo:
        op = todo.pop()
        if op.type in ITERATOR_READS and op.inputs:
            found.append(op.inputs[0].op.name)
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            if source.name not in seen:
                seen.add(source.name)
                todo.append(source)
    return sorted(set(found))


def warn_saved_iterators(graph: tf.Graph, stage_defs: list[StageDef]) -> list[tuple[str, str]]:
    """Warns (once per stage and iterator) for each lanes stage that reads a checkpointed iterator; returns
    the (stage, iterator) pairs warned about now.

        before:  start_prefetch_threads(sess) on a stage reading a saved iterator      (silent)
        after:   one WARNING naming the stage, the iterator and the fix
    """
    saved = saved_iterators(graph)
    if not saved:
        return []
    warned = []
    for stage_def in stage_defs:
        try:
            put = graph.get_operation_by_name(stage_def.put_node)
        except KeyError:
            continue
        for iterator in iterators_read(put):
            key = (stage_def.name, iterator)
            with _lock:
                if iterator not in saved or key in _warned:
                    continue
                _warned.add(key)
            warned.append(key)
            logger.warning(
                "stage %r runs on lanes and reads iterator %r, whose position is checkpointed: a restore resumes "
                "after the batches the stage had buffered, and those are not trained; fold the stage into its "
                "dataset (a SmartStage session with tf_data_stage='fold', the default) for an exact restore",
                stage_def.name, iterator)
    return warned


__all__ = ["iterators_read", "saved_iterators", "warn_saved_iterators"]
