"""optimize(): load a graph, run the SmartStage passes (passes/manager.PassManager), return the rewritten graph and its report.

    before:  reader -> decode -> put ~~ take -> hash -> lookup(w) -> loss
    after:   reader -> decode -> hash -> put ~~ take -> lookup(w) -> loss

    result = optimize(graph_def, ss.enable_smart_stage(tf.compat.v1.ConfigProto()), targets=["train_op"])
    print(result.summary())
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import fields

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.config.options import SmartStageOptions, options_from_config
from smartstage.config.renamed import renamed_keywords
from smartstage.errors import ConfigError, TargetError
from smartstage.graph.edits import stage_defs_after
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.load import (STAGES_COLLECTION, collection_targets, load_graph, stage_defs_of,
                                   store_stage_defs)
from smartstage.passes.manager import PassContext, PassManager
from smartstage.result import OptimizeResult


def _own(message, borrowed: bool):
    """`message`, copied when it is the caller's own: a result never aliases the input."""
    if message is None or not borrowed:
        return message
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _names(value, what: str) -> list[str]:
    """`targets`/`feeds` as names: one name, tensor or operation is one item; else an iterable of them.

        before:  optimize(g, config, targets="zsum")    # iterated: targets 'z', 's', 'u', 'm'
        after:   _names("zsum", "targets") == ["zsum"]; _names([loss, "stage/take:0"], ...) == ["loss:0", ...]
    """
    if value is None:
        return []
    items = [value] if isinstance(value, str) or _graph_element(value) else value
    try:
        items = list(items)
    except TypeError:
        raise ConfigError(f"optimize(): {what}={value!r} ({type(value).__name__}) is not a target list; pass a node or tensor name, "
                          "a tf.Tensor or tf.Operation, or a list of them") from None
    names = []
    for item in items:
        name = item.name if _graph_element(item) else item
        if not isinstance(name, str) or not name:
            raise ConfigError(f"optimize(): {what} holds {item!r} ({type(item).__name__}); pass node or tensor "
                              "names ('loss', 'stage/take:0'), tf.Tensor or tf.Operation objects")
        names.append(name)
    return names


def _graph_element(item) -> bool:
    """A tf.Tensor, tf.Operation or variable: named, and of a graph (never iterated as a sequence)."""
    return not isinstance(item, str) and isinstance(getattr(item, "name", None), str) and hasattr(item, "graph")


def _target_ports(names: list[str], bare: set[str]) -> dict[str, frozenset[int]]:
    """{node: ports} for nodes named only as tensors ("stage/take:0"); a node also named bare keeps all."""
    ports: dict[str, set[int]] = {}
    for name in names:
        t = parse_tensor_name(name)
        if ":" in name and not t.is_control:
            ports.setdefault(t.node, set()).add(t.port)
        else:
            bare.add(t.node)
    return {node: frozenset(p) for node, p in ports.items() if node not in bare}


def check_ports(view, names: list[str], what: str) -> None:
    """TargetError for a tensor name whose node has fewer outputs ("zsum:7" where zsum has one)."""
    for name in names:
        t = parse_tensor_name(name)
        if ":" not in name or t.is_control or t.node not in view:
            continue  # a node named bare has no port to check; a missing node is reported by the partition
        dtypes = view.output_dtypes(t.node)
        if dtypes is not None and t.port >= len(dtypes):
            outputs = ", ".join(f"{t.node}:{i}" for i in range(len(dtypes))) or "none"
            raise TargetError(f"{what[:-1]} {name!r}: node {t.node!r} ({view.op(t.node)}) has {len(dtypes)} "
                              f"output(s) ({outputs}), no output {t.port}; name one of them or the node itself")


def _check_overrides(overrides: dict) -> None:
    accepted = sorted(f.name for f in fields(SmartStageOptions) if f.name != "source")
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise ConfigError(f"optimize(): unknown keyword argument(s) {unknown}; besides graph, config, targets and "
                          f"feeds it accepts the option overrides {accepted}")


def build_pass_manager(options: SmartStageOptions) -> PassManager:
    """The passes the flags ask for, in their fixed order."""
    from smartstage.passes import passes_for

    return PassManager(passes_for(options), verify=options.verify)


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
    targets: what the training step fetches (kept on the main side, with what they depend on after the stage):
      a node or tensor name, a tf.Tensor or tf.Operation, or a list of them. An output of a stage's take
      (what staged() returned) named here keeps crossing the stage; result.fetch_map() says where.
    feeds: nodes the training step feeds besides placeholders (the same forms).
    overrides: SmartStageOptions fields (do_smart_stage, auto_stage, verify, ...); another keyword is a
      ConfigError naming it.

    before:  put(decode) ~~ take -> hash -> lookup(w)
    after:   put(hash)   ~~ take -> lookup(w)
    """
    with _without_cycle_collection():
        return _optimize(graph, config, targets, feeds, overrides)


def partition_at_inputs(graph_def: graph_pb2.GraphDef, inputs, targets, feeds=()) -> OptimizeResult:
    """The partition of a graph whose boundary is its own input nodes (a TF2 step's function graph), run by
    the same PassManager and Partition pass as optimize(): nothing is rewritten, the one partition and the
    passes' reports are in the result (summary(), diff(), explain and the HTML report read it).

    inputs: the input nodes in the order of the tensors they stand for (output 0 each); targets: what the step
    runs; feeds: other nodes it feeds. TargetError / GraphError as passes.partition_inputs raises them.

        before:  batch(Placeholder) -> hash -> lookup(w) -> loss
        after:   partition_at_inputs(g, ["batch"], ["loss"]).partitions[0].moved == ("hash",)
    """
    from smartstage.passes.partition import Partition
    from smartstage.passes.partition_inputs import InputBoundary

    start = time.perf_counter()
    options = options_from_config(None, do_smart_stage=True)
    ctx = PassContext(options=options, targets={parse_tensor_name(n).node for n in targets},
                      feeds={parse_tensor_name(n).node for n in feeds})
    with _without_cycle_collection():
        _, reports = PassManager([InputBoundary(inputs), Partition()], verify=False).run(graph_def, ctx)
    return OptimizeResult(graph_def=graph_def, original_graph_def=graph_def, options=options,
                          reports=tuple(reports), partitions=tuple(ctx.partitions), targets=frozenset(ctx.targets),
                          seconds=time.perf_counter() - start)


def _optimize(graph, config, targets, feeds, overrides) -> OptimizeResult:
    start = time.perf_counter()
    overrides = renamed_keywords("optimize()", overrides)
    _check_overrides(overrides)
    target_list, feed_list = _names(targets, "targets"), _names(feeds, "feeds")
    options = options_from_config(config, **overrides)
    # The caller's GraphDef is read, not copied: passes build new graphs and never edit their input. What
    # the result hands back is never the caller's own message, though (see _own).
    loaded = load_graph(graph, copy=False)
    original = loaded.graph_def
    from_collections = collection_targets(loaded.meta_graph_def)
    target_names = {parse_tensor_name(n).node for n in target_list} | from_collections
    feed_names = {parse_tensor_name(n).node for n in feed_list}
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
    # An output of a take named as a target keeps crossing the stage (see partition_stages).
    ctx.target_ports = _target_ports(target_list, set(from_collections))
    view = ctx.view_of(loaded.graph_def)
    check_ports(view, target_list, "targets")
    check_ports(view, feed_list, "feeds")
    view.check_inputs()
    view.order()  # GraphError naming a cycle
    graph_def, reports = build_pass_manager(options).run(loaded.graph_def, ctx)

    meta = None
    if loaded.meta_graph_def is not None:
        meta = meta_graph_pb2.MetaGraphDef()
        meta.CopyFrom(loaded.meta_graph_def)
        if graph_def is not loaded.graph_def:
            meta.graph_def.CopyFrom(graph_def)
        graph_def = meta.graph_def
        # The StageDefs the passes' edit logs leave (passes never edit the given protos in place).
        stage_defs = stage_defs_after(ctx.stage_defs, (e for r in reports for e in r.edits))
        store_stage_defs(meta, stage_defs)
        if not stage_defs and STAGES_COLLECTION in meta.collection_def:  # every stage folded into its dataset
            del meta.collection_def[STAGES_COLLECTION]
    elif graph_def is loaded.graph_def:  # nothing changed
        graph_def = _own(graph_def, loaded.borrowed)
    return OptimizeResult(
        graph_def=graph_def, original_graph_def=original, options=options, reports=tuple(reports),
        partitions=tuple(ctx.partitions), meta_graph_def=meta, targets=frozenset(target_names),
        notes=tuple(ctx.notes), seconds=time.perf_counter() - start, auto_stage=ctx.auto_stage,
        gpu_placement=dict(ctx.gpu_placement), multi_stream=dict(ctx.multi_stream),
    )
