"""`staged()`: a stage boundary built from stock TensorFlow ops, described in the graph.

    before:  features = parse(batch)                        # the step parses every batch itself
    after:   features = ss.staged(parse(batch), capacity=4)  # prefetch threads parse ahead

What one call builds, under the name scope `<scope>` (default "stage", made unique):

    <scope>/buffer        FIFOQueueV2, shared_name=<scope>, the bounded buffer
    <scope>/put           QueueEnqueueV2(buffer, components)   run by the prefetch threads
    <scope>/take          QueueDequeueV2(buffer)                what the main side reads
    <scope>/close         QueueCloseV2                          end of input: takes drain, then OutOfRange
    <scope>/cancel        QueueCloseV2(cancel_pending_enqueues) shutdown: wakes blocked puts and takes
    <scope>/size          QueueSizeV2                           buffered batches
    <scope>/is_closed     QueueIsClosedV2                       checked when prefetch threads start
    <scope>/ready_buffer  FIFOQueueV2 (capacity 1, int32)       holds a token once prefetch threads run
    <scope>/ready_put     QueueEnqueueV2(ready_buffer, token)   run once when the threads start
    <scope>/ready_check   Assert(QueueSizeV2(ready_buffer) > 0) a control input of the take

The guard is all in the graph: a step that takes from a stage whose prefetch threads never started
fails at once with an InvalidArgumentError naming the stage and the fix, instead of hanging. It
survives export_meta_graph / import_meta_graph and GraphDef rewrites that keep names, because it
needs no Python state.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_data_flow_ops, gen_logging_ops

from smartstage.errors import ConfigError
from smartstage.protos.stage_pb2 import FeedDef, StageDef
from smartstage.config.error_codes import error_codes
from smartstage.graph.stages import missing_hook_message
from smartstage.runtime.stage.settings import AUTOTUNE
from smartstage.runtime.stage.metadata import add_stage_def
from smartstage.runtime.stage.arguments import check_setting_arguments, check_staged_arguments

logger = logging.getLogger(__name__)

DEFAULT_STAGE_NAME = "stage"


def _flatten_features(features: Any) -> tuple[list[tf.Tensor | None], Any]:
    """The component tensors of `features` (SparseTensors expanded) and the structure to rebuild."""
    if isinstance(features, dict):
        for key in features:
            if not isinstance(key, str):
                raise ConfigError(
                    f"staged(): the dict of features has the key {key!r}; use string keys only"
                )

    def convert(leaf):
        if leaf is None or isinstance(leaf, (tf.Tensor, tf.SparseTensor)) or hasattr(leaf, "_type_spec"):
            return leaf
        return tf.convert_to_tensor(leaf)

    try:
        structure = tf.nest.map_structure(convert, features)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"staged(): features must be a tensor, SparseTensor, or a list or dict of them ({error})"
        ) from error
    components = tf.nest.flatten(structure, expand_composites=True)
    if not any(c is not None for c in components):
        raise ConfigError("staged(): features hold no tensor; pass at least one tensor to stage")
    return components, structure


def _feed_defs(
    feed_dict: dict | None, graph: tf.Graph
) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """(placeholder, value tensor) pairs; Python and numpy values become Const nodes of the graph."""
    pairs: list[tuple[tf.Tensor, tf.Tensor]] = []
    for index, (key, value) in enumerate((feed_dict or {}).items()):
        keys = tf.nest.flatten(key, expand_composites=True)
        if isinstance(value, (tf.Tensor, tf.SparseTensor)):
            values = tf.nest.flatten(value, expand_composites=True)
        elif isinstance(value, tf.compat.v1.SparseTensorValue):
            values = [tf.constant(value.indices), tf.constant(value.values), tf.constant(value.dense_shape)]
        else:
            values = [None] * len(keys)
            if len(keys) == 1:
                values = [tf.constant(np.asarray(value), dtype=keys[0].dtype, name=f"feed_value_{index}")]
        if len(keys) != len(values) or any(v is None for v in values):
            raise ConfigError(
                f"staged(): feed_dict maps {key!r} to {value!r}; map each placeholder to a tensor or "
                "a value of the same structure (a SparseTensor placeholder to a SparseTensor)"
            )
        for placeholder, tensor in zip(keys, values):
            if not isinstance(placeholder, tf.Tensor) or placeholder.graph is not graph:
                raise ConfigError(
                    f"staged(): the feed_dict key {placeholder!r} is not a tensor of the graph being "
                    "built; key feed_dict by the prefetch-side placeholders"
                )
            if tensor.graph is not graph:
                raise ConfigError(
                    f"staged(): the feed value {tensor.name!r} belongs to another graph; build it in "
                    "the same graph as the stage"
                )
            if placeholder.dtype.base_dtype != tensor.dtype.base_dtype:
                raise ConfigError(
                    f"staged(): feed_dict feeds {placeholder.name} ({placeholder.dtype.name}) from "
                    f"{tensor.name} ({tensor.dtype.name}); cast the value to the placeholder's dtype"
                )
            pairs.append((placeholder, tensor))
    return pairs



def staged(
    features: Any,
    feed_dict: dict | None = None,
    capacity: int = AUTOTUNE,
    num_threads: int = AUTOTUNE,
    num_clients: int = 1,
    timeout_millis: int = 300000,
    closed_exception_types=(tf.errors.OutOfRangeError,),
    ignored_exception_types=(),
    use_stage_subgraph_thread_pool: bool | int = AUTOTUNE,
    stage_subgraph_thread_pool_id: int = 0,
    stage_subgraph_stream_id: int = 0,
    name: str | None = None,
    deterministic: bool = True,
    max_buffered_bytes: int | None = None,
) -> Any:
    """Puts `features` behind a stage: prefetch threads compute them ahead into a bounded buffer.

    Takes every parameter of DeepRec's `tf.staged`, with the same meaning:

    features: a tensor, SparseTensor, or a list or dict (string keys) of them. The result has the
        same structure; SparseTensors travel as their components and are rebuilt. Static shapes of
        the outputs are those of the inputs.
    feed_dict: {prefetch-side placeholder: value}. The value is a tensor of the same graph (or a
        Python/numpy value, stored as a Const node). Before every put, the prefetch thread evaluates
        the value tensors in the same session (one run, with the stage's run options) and feeds the
        results to the placeholders, so each batch sees the values current at that moment.
    capacity: batches the buffer holds. AUTOTUNE (the default): the runtime picks it while training,
        within `max_buffered_bytes` and 64 batches (the queue itself is unbounded; the prefetch threads
        keep it under the tuned capacity).
    num_threads: threads producing batches. Batches arrive in input order at every count (the
        order-dependent head of the prefetch side runs serially, the rest on `num_threads` lanes).
        AUTOTUNE (the default): the runtime measures and picks the count (1 included).
    num_clients: main-side readers of the stage; recorded (a FIFO queue serves any number of
        takers, each batch to exactly one).
    timeout_millis: a put waiting longer than this logs a warning and keeps waiting; batches are
        never dropped.
    closed_exception_types: errors meaning a normal end of input (classes or tf.errors codes).
        When every prefetch thread ended with one, the buffer closes: the main side takes what is
        buffered, then gets OutOfRangeError.
    ignored_exception_types: errors after which a prefetch thread logs and goes on.
    use_stage_subgraph_thread_pool / stage_subgraph_thread_pool_id: True: prefetch runs use
        `RunOptions(inter_op_thread_pool=stage_subgraph_thread_pool_id)`, i.e. the session's
        `ConfigProto.session_inter_op_thread_pool[stage_subgraph_thread_pool_id]`. Starting the
        prefetch threads fails with StageRuntimeError when the session has no such pool. Once any
        pool is configured, main-side steps run on pool 0, so give the stage pool 1. False: the
        session's pool, shared with the steps. AUTOTUNE (the default): the runtime tries the session's
        last pool against the shared one while training and keeps the faster (runtime/lanes/tuning/pools.py: the
        sessions SmartStage makes have one; a session with a single pool keeps the shared one);
        recorded as stage_subgraph_thread_pool_id = AUTOTUNE.
    stage_subgraph_stream_id: recorded on the stage for the GPU multi-stream pass.
    name: the stage's name scope (default "stage", made unique in the graph).
    deterministic: True (default): input order at every num_threads. False: the explicit opt-out,
        `num_threads` threads run the whole put at once and batches arrive in any order (like
        tf.data's deterministic=False); recorded as StageDef.unordered.
    max_buffered_bytes: the cap on buffered bytes a tuned capacity keeps to (default None: 256 MiB;
        explicit capacities are kept as given).

    Start the prefetch threads with `make_prefetch_hook()` (MonitoredTrainingSession) or
    `start_prefetch_threads(sess)` (a plain Session); without them a step reading the stage fails
    at once with an error that says so.

        before:  x, y = parse(batch)
        after:   x, y = ss.staged([x, y], capacity=2)   # + hooks=[ss.make_prefetch_hook()]
    """
    check_staged_arguments(features, feed_dict, name)
    check_setting_arguments(capacity, num_threads, num_clients, timeout_millis, use_stage_subgraph_thread_pool,
                     stage_subgraph_thread_pool_id, stage_subgraph_stream_id, max_buffered_bytes)
    tune_pool = stage_subgraph_thread_pool_id == AUTOTUNE or (
        not isinstance(use_stage_subgraph_thread_pool, (bool, np.bool_)) and use_stage_subgraph_thread_pool == AUTOTUNE)
    closed_codes = error_codes(closed_exception_types, "staged(closed_exception_types=...)")
    ignored_codes = error_codes(ignored_exception_types, "staged(ignored_exception_types=...)")
    overlap = set(closed_codes) & set(ignored_codes)
    if overlap:
        raise ConfigError(
            f"staged(): error codes {sorted(overlap)} are both closed and ignored; list each in one only"
        )
    components, structure = _flatten_features(features)
    present = [c for c in components if c is not None]
    graph = present[0].graph
    for component in present:
        if component.graph is not graph:
            raise ConfigError(
                f"staged(): {component.name} belongs to another graph than {present[0].name}; "
                "stage tensors of one graph"
            )

    with graph.as_default(), tf.compat.v1.name_scope(name, DEFAULT_STAGE_NAME, present) as scope:
        stage_name = scope.rstrip("/")
        feeds = _feed_defs(feed_dict, graph)
        dtypes = [c.dtype.base_dtype for c in present]
        shapes = [c.shape for c in present]
        fully_defined = all(s.is_fully_defined() for s in shapes)
        buffer = gen_data_flow_ops.fifo_queue_v2(
            component_types=dtypes,
            shapes=shapes if fully_defined else [],
            # AUTOTUNE: an unbounded queue (-1, as auto-stage builds it); the prefetch threads keep it
            # under the tuned capacity and max_buffered_bytes (runtime/lanes/tuning/autotune.py).
            capacity=capacity,
            shared_name=stage_name,
            name="buffer",
        )
        put = gen_data_flow_ops.queue_enqueue_v2(buffer, present, name="put")
        ready_buffer = gen_data_flow_ops.fifo_queue_v2(
            component_types=[tf.int32], shapes=[[]], capacity=1,
            shared_name=stage_name + "/ready_buffer", name="ready_buffer",
        )
        ready_token = tf.constant(1, dtype=tf.int32, name="ready_token")
        ready_put = gen_data_flow_ops.queue_enqueue_v2(ready_buffer, [ready_token], name="ready_put")
        ready_size = gen_data_flow_ops.queue_size_v2(ready_buffer, name="ready_size")
        ready = tf.greater(ready_size, 0, name="ready")
        ready_check = gen_logging_ops._assert(  # noqa: SLF001  (the stock Assert op, named exactly)
            ready, [tf.constant(missing_hook_message(stage_name), name="ready_message")],
            name="ready_check",
        )
        with tf.control_dependencies([ready_check]):
            taken = gen_data_flow_ops.queue_dequeue_v2(buffer, component_types=dtypes, name="take")
        taken = list(taken) if isinstance(taken, (list, tuple)) else [taken]
        for tensor, shape in zip(taken, shapes):
            tensor.set_shape(shape)
        close = gen_data_flow_ops.queue_close_v2(buffer, cancel_pending_enqueues=False, name="close")
        cancel = gen_data_flow_ops.queue_close_v2(buffer, cancel_pending_enqueues=True, name="cancel")
        size = gen_data_flow_ops.queue_size_v2(buffer, name="size")
        # Lets the runner refuse a buffer that an earlier session on the same server closed.
        gen_data_flow_ops.queue_is_closed_v2(buffer, name="is_closed")

    stage_def = StageDef(
        name=stage_name,
        kind=StageDef.FIFO_QUEUE,
        buffer_node=buffer.op.name,
        put_node=put.name,
        take_node=taken[0].op.name,
        close_node=close.name,
        cancel_node=cancel.name,
        size_node=size.op.name,
        ready_buffer_node=ready_buffer.op.name,
        ready_put_node=ready_put.name,
        capacity=int(capacity),
        num_threads=int(num_threads),
        num_clients=int(num_clients),
        timeout_millis=int(timeout_millis),
        closed_error_codes=closed_codes,
        ignored_error_codes=ignored_codes,
        use_stage_subgraph_thread_pool=False if tune_pool else bool(use_stage_subgraph_thread_pool),
        stage_subgraph_thread_pool_id=AUTOTUNE if tune_pool else int(stage_subgraph_thread_pool_id),
        stage_subgraph_stream_id=int(stage_subgraph_stream_id),
        feeds=[FeedDef(placeholder=p.name, tensor=t.name) for p, t in feeds],
        origin="staged",
        boundary_tensors=[c.name for c in present],
        unordered=not deterministic,
        max_buffered_bytes=int(max_buffered_bytes or 0),
    )
    add_stage_def(graph, stage_def)
    logger.debug("built stage %s: %d tensors, capacity %d, %d threads (-1: AUTOTUNE), %s",
                 stage_name, len(present), capacity, num_threads, "ordered" if deterministic else "unordered")

    outputs = iter(taken)
    rebuilt = [None if c is None else next(outputs) for c in components]
    return tf.nest.pack_sequence_as(structure, rebuilt, expand_composites=True)
