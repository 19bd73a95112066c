"""optimize(): load a graph, run the SmartStage pass pipeline, return the rewritten graph and its report.

    before:  reader -> decode -> put ~~ take -> hash -> lookup(w) -> loss
    after:   reader -> decode -> hash -> put ~~ take -> lookup(w) -> loss

    result = optimize(graph_def, ss.enable_smart_stage(tf.compat.v1.ConfigProto()), targets=["train_op"])
    print(result.summary())
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Iterable

from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.config.options import SmartStageOptions, options_from_config
from smartstage.errors import GraphError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.load import collection_targets, load_graph, stage_defs_of, store_stage_defs
from smartstage.passes.manager import PassContext, Pipeline
from smartstage.result import OptimizeResult


def _own(message, borrowed: bool):
    """`message`, copied when it is the caller's own: a result never aliases the input."""
    if message is None or not borrowed:
        return message
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _node_names(names: Iterable[str] | None, what: str) -> set[str]:
    result = set()
    for name in names or ():
        if hasattr(name, "name") and not isinstance(name, str):
            name = name.name
        if not isinstance(name, str) or not name:
            raise GraphError(f"{what} must be node or tensor names (strings), got {name!r}")
        result.add(parse_tensor_name(name).node)
    return result


def build_pipeline(options: SmartStageOptions) -> Pipeline:
    """The passes the flags ask for, in their fixed order."""
    from smartstage.passes import pipeline_passes

    return Pipeline(pipeline_passes(options), verify=options.verify)


@contextlib.contextmanager
def _without_cycle_collection():
    """Python's cycle collector off for the duration: the pass allocates hundreds of thousands of small
    containers, none in a cycle, and the collector's full passes over them cost about a sixth of the run
    on a 100,000-node graph (reference counting still frees everything). Restored as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def optimize(graph, config=None, *, targets=None, feeds=None, **overrides) -> OptimizeResult:
    """Expands every stage of `graph` to all ops that do not depend on trainable state.

    graph: a GraphDef, MetaGraphDef, tf.Graph, or the path of a .pb/.pbtxt/.meta file.
    config: a tf.compat.v1.ConfigProto (custom_optimizers entry "SmartStage"), an ss.ConfigProto
      (DeepRec spelling), or None. With no flag set the graph comes back unchanged, and the report says so.
    targets: nodes the training step fetches (kept on the main side, with what they depend on after the stage).
    feeds: nodes the training step feeds besides placeholders.

    before:  put(decode) ~~ take -> hash -> lookup(w)
    after:   put(hash)   ~~ take -> lookup(w)
    """
    with _without_cycle_collection():
        return _optimize(graph, config, targets, feeds, overrides)


def _optimize(graph, config, targets, feeds, overrides) -> OptimizeResult:
    start = time.perf_counter()
    options = options_from_config(config, **overrides)
    # The caller's GraphDef is read, not copied: passes build new graphs and never edit their input. What
    # the result hands back is never the caller's own message, though (see _own).
    loaded = load_graph(graph, copy=False)
    original = loaded.graph_def
    target_names = _node_names(targets, "targets") | collection_targets(loaded.meta_graph_def)
    feed_names = _node_names(feeds, "feeds")
    if not options.enabled:
        meta = _own(loaded.meta_graph_def, loaded.borrowed)
        return OptimizeResult(
            graph_def=meta.graph_def if meta is not None else _own(loaded.graph_def, loaded.borrowed),
            original_graph_def=original, options=options,
            meta_graph_def=meta, targets=frozenset(target_names),
            notes=("SmartStage is off: set do_smart_stage (ss.enable_smart_stage(config)) or "
                   "config.graph_options.optimizer_options.do_smart_stage = True on an ss.ConfigProto; "
                   "the graph is returned unchanged",),
            seconds=time.perf_counter() - start,
        )
    ctx = PassContext(options=options, targets=target_names, feeds=feed_names,
                      stage_defs=stage_defs_of(loaded.meta_graph_def))
    view = ctx.view_of(loaded.graph_def)
    view.check_inputs()
    view.order()  # GraphError naming a cycle
    graph_def, reports = build_pipeline(options).run(loaded.graph_def, ctx)

    meta = None
    if loaded.meta_graph_def is not None:
        meta = meta_graph_pb2.MetaGraphDef()
        meta.CopyFrom(loaded.meta_graph_def)
        if graph_def is not loaded.graph_def:
            meta.graph_def.CopyFrom(graph_def)
        graph_def = meta.graph_def
        store_stage_defs(meta, [s.stage_def for s in ctx.stages if s.stage_def is not None])
    elif graph_def is loaded.graph_def:  # nothing changed
        graph_def = _own(graph_def, loaded.borrowed)
    return OptimizeResult(
        graph_def=graph_def, original_graph_def=original, options=options, reports=tuple(reports),
        partitions=tuple(ctx.partitions), meta_graph_def=meta, targets=frozenset(target_names),
        notes=tuple(ctx.notes), seconds=time.perf_counter() - start, extra=dict(ctx.extra),
    )
