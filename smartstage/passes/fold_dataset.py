"""fold_dataset: a stage that reads a tf.data iterator becomes part of the dataset; the buffer is gone.

    before (after expand_stage):
        batch ==MakeIterator==> it -> IteratorGetNext -> sqrt -> lookup(table) -> put ~~ take -> mul(w) -> loss
    after:
        batch -> stage/dataset_fold/MapDataset(sqrt, lookup; deterministic, num_parallel_calls=threads)
              -> stage/dataset_fold/PrefetchDataset(capacity) ==MakeIterator==> it
        it -> stage/dataset_fold/IteratorGetNext -> mul(w) -> loss

The moved subgraph (everything between the iterator read and the put) runs as a deterministic parallel
`map` of the iterator's dataset, followed by a `prefetch`: order, parallelism, buffering and AUTOTUNE
are tf.data's, the iterator's saved state (make_saveable_from_iterator) holds what is buffered, and the
graph needs nothing of SmartStage at run time: one session.run per step, no thread of ours. The
iterator yields exactly the boundary tensors, in the put's order; the main side reads a new
IteratorGetNext of the same iterator where it read the take (a live op's outputs cannot change, so the
old read is replaced rather than edited). The buffer, put, take, close/cancel/size and the guard ops
leave the graph, and so does the stage's StageDef: no runtime starts threads for it.

Which iterators: `make_initializable_iterator` and `Iterator.from_structure` (every MakeIterator of the
iterator, i.e. every dataset that initializes it, gets the same map and prefetch), and
`make_one_shot_iterator` (its dataset_factory function is replaced by one that builds the old dataset
and then the map and prefetch; a read-only table the map reads is made inside the factory from the same
shared_name, so it is the very table the graph's initializer fills: a one-shot iterator cannot capture a
table's handle by value). The iterator op keeps its name (checkpoints name it); its output_types and
output_shapes become the boundary's.

What the map carries: stateless ops, reads of read-only tables (lookups, and the table's size a
StaticVocabularyTable's lookup reads; the map captures the table's handle), and the other order-free
stateful ops (Assert, Print). A stage is left as it was, with the reason in the
summary, when its prefetch side is not exactly one iterator read and a body (another input op, a random
op, a variable, a mutable table, a py_func that keeps state, a fed placeholder), when a body tensor is
read outside the prefetch side, when the stage has a feed_dict, or when the iterator is read elsewhere.
Those stages keep the lanes (docs/runtime.md). The analysis is passes/fold_fit.py (FoldFit, fold_fit); this
module records the edits. With do_smart_stage_gpu the moved work folds the same way but the stage keeps its
buffer, which the GPU passes place on the device, filled by one thread from the new read (fold_fit.GPU_REASON:
why not prefetch_to_device): the host-to-device copy stays off the step.
A session applies the same edit log to the live graph (session/live_rewrite.py): the old ops stay, detached.

Values: the map computes what the moved ops compute in the step, batch for batch, in input order
(deterministic=True unless staged(deterministic=False)). A session's Grappler rewrites the graphs it runs
(a division by a constant becomes a multiplication by its reciprocal, last-ulp different) and does not
rewrite a dataset's functions, so the body is rewritten by Grappler the same way before it becomes the
map's function (passes/dataset_map.py, as_a_session_rewrites): flag off and on agree bit for bit.
"""

from __future__ import annotations

import dataclasses
import logging

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def, dedupe_controls
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.op_types import ITERATOR_READS
from smartstage.graph.view import GraphView
from smartstage.passes.dataset_map import DatasetBody, copy_scratch, scratch_dataset_graph
from smartstage.passes.fold_fit import (AUTOTUNE, GPU_REASON, INITIALIZABLE_ITERATORS, ONE_SHOT_ITERATORS, SCOPE,
                                       FoldFit, fold_fit)
from smartstage.passes.gpu.prefetch_sides import stage_sides
from smartstage.passes.manager import PassContext, PassResult
from smartstage.passes.stage_defs import replace_stage_def, with_fields

logger = logging.getLogger(__name__)

# Why no stage folds in a graph without an iterator read (found by one sweep over the op types, before any
# per-stage analysis: a graph fed by queues or readers costs the pass next to nothing).
NO_ITERATOR = (f"nothing to fold: the graph has no tf.data iterator read ({', '.join(sorted(ITERATOR_READS))}), "
               "so no stage reads a dataset")


class FoldDataset:
    """Folds each stage that reads a tf.data iterator into the iterator's dataset (options.tf_data_stage="fold")."""

    name = "fold_dataset"
    requires = ("stages", "partitions")
    provides = ()

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        gpu = ctx.options.do_smart_stage_gpu  # the stage keeps its buffer for the GPU (fold_fit.GPU_REASON)
        if not view.nodes_of_type(ITERATOR_READS):  # one sweep over the op types: no stage can read a dataset
            fits = {s.name: FoldFit(s.name, skipped=NO_ITERATOR) for s in ctx.stages}
            return PassResult(graph_def, changed=False, details=fits,
                              summary=tuple(f"{name}: keeps its buffer and lanes: {NO_ITERATOR}" for name in fits))
        sides = stage_sides(view, ctx.stages)  # only the sides: fold_fit needs no shared nodes
        fits = {s.name: fold_fit(view, s, sides.get(s.name, frozenset()), set(ctx.targets)) for s in ctx.stages}
        if gpu:
            fits = {name: dataclasses.replace(fit, keeps_buffer=True) if fit.folds else fit
                    for name, fit in fits.items()}
        summary = [f"{name}: keeps its buffer and lanes: {fit.skipped}" for name, fit in fits.items() if fit.skipped]
        chosen = [fit for fit in fits.values() if fit.folds]
        if not chosen:
            return PassResult(graph_def, changed=False, summary=tuple(summary), details=fits)
        log = EditLog(view)
        library = {f.signature.name: f for f in graph_def.library.function}
        for fit in chosen:
            fold_stage(log, view, fit, library, ctx.options.session_rewrites)
            logger.info("stage %r: %d node(s) folded into the dataset of %r", fit.stage, len(fit.body), fit.iterator)
            into = (f"{fit.stage}: folded into the dataset of iterator {fit.iterator!r}: map({len(fit.body)} node(s), "
                    f"num_parallel_calls={_setting(fit.num_parallel_calls)}, deterministic={fit.deterministic}) then "
                    f"prefetch({_setting(fit.buffer_size)}); the iterator yields the {len(fit.outputs)} boundary "
                    f"tensor(s)")
            if fit.keeps_buffer:
                stage = next(s for s in ctx.stages if s.name == fit.stage)
                feed_buffer_from_read(log, view, fit)
                if stage.stage_def is not None:  # one thread moves each batch from the iterator to the buffer
                    replace_stage_def(ctx, log, stage, with_fields(
                        stage.stage_def, boundary_tensors=[f"{read_name(fit)}:{k}" for k in range(len(fit.outputs))],
                        num_threads=1))
                summary.append(f"{into}, which one thread puts into the stage's buffer ({GPU_REASON})")
            else:
                log.remove_stage_def(fit.stage)
                summary.append(f"{into}, the step reads {read_name(fit)}; the buffer and its {len(fit.removed)} "
                               "op(s) are gone")
        rewire_folded(log, view, [fit for fit in chosen if not fit.keeps_buffer])
        folded = {fit.stage for fit in chosen if not fit.keeps_buffer}
        ctx.stages[:] = [s for s in ctx.stages if s.name not in folded]
        new = apply_to_graph_def(graph_def, log.edits, view)
        return PassResult(new, changed=True, summary=tuple(summary), details=fits, edits=log.edits)


def feed_buffer_from_read(log: EditLog, view: GraphView, fit: FoldFit) -> None:
    """A folded stage that keeps its buffer (do_smart_stage_gpu): the put carries the new read's outputs, the old
    read and the body leave the graph (they run in the map; checks the put waited on too).

        before:  IteratorGetNext -> sqrt -> put(buffer, sqrt) ~~ take -> mul(w)
        after:   stage/dataset_fold/IteratorGetNext -> put(buffer, stage/dataset_fold/IteratorGetNext) ~~ take -> mul(w)
    """
    dropped = (set(fit.body) - set(fit.kept)) | {fit.read}
    inputs = list(log.inputs_of(fit.put))
    data = [raw for raw in inputs if not raw.startswith("^")]
    control = [raw for raw in inputs if raw.startswith("^") and raw[1:] not in dropped]
    read = read_name(fit)
    log.set_inputs(fit.put, [data[0], *(f"{read}:{k}" if k else read for k in range(len(fit.outputs))), *control])
    for name in view.order():
        if name in dropped:
            log.remove_node(name)


def _setting(value: int) -> str:
    return "AUTOTUNE" if value == AUTOTUNE else str(value)


def read_name(fit: FoldFit) -> str:
    """The IteratorGetNext the pass adds for a folded stage: the step reads the boundary tensors from it."""
    return f"{fit.stage}/{SCOPE}/IteratorGetNext"


def fold_stage(log: EditLog, view: GraphView, fit: FoldFit, library: dict[str, function_pb2.FunctionDef],
               session_rewrites: bool = True) -> None:
    """Records the fold of one stage: the map and prefetch after each dataset, the iterator's new element
    types, the new read (rewire_folded then points the main side at it and removes what the fold replaces).
    session_rewrites: the sessions that run the graph rewrite it with Grappler, so the map's body is rewritten
    the same way (dataset_map.as_a_session_rewrites); False when they run it as written."""
    body = DatasetBody(fit.read, fit.body, fit.outputs, fit.captures, fit.waits)
    device = view.node(fit.read).device

    def prefetched(dataset):
        return dataset.prefetch(fit.buffer_size)

    types = shapes = None
    if fit.one_shot:
        types, shapes = _fold_one_shot(log, view, fit, body, library, session_rewrites)
    for k, maker in enumerate(fit.makers):
        scope = f"{fit.stage}/{SCOPE}" + (f"_{k}" if k else "")
        dataset = view.raw_inputs(maker)[0]
        scratch = scratch_dataset_graph(view, body, scope + "/", prefetched, source_tensor=dataset,
                                        num_parallel_calls=fit.num_parallel_calls, deterministic=fit.deterministic,
                                        rewrite_as_session=session_rewrites)
        names, _ = copy_scratch(log, scratch, library, scope.replace("/", "_"), view.node(maker).device or device)
        types, shapes = scratch.output_types, scratch.output_shapes
        end = names[parse_tensor_name(scratch.dataset).node]
        inputs = [end, *view.raw_inputs(maker)[1:]]
        gone = set() if fit.keeps_buffer else set(fit.removed)  # a kept buffer keeps what empties it on re-init
        log.set_inputs(maker, dedupe_controls(raw for raw in inputs if parse_tensor_name(raw).node not in gone))
    type_list = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=list(types)))
    shape_list = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(shape=list(shapes)))
    log.set_attr(fit.iterator, "output_types", type_list)
    log.set_attr(fit.iterator, "output_shapes", shape_list)
    old_read = view.node(fit.read)
    read = node_def_pb2.NodeDef(name=read_name(fit), op=old_read.op, input=[old_read.input[0]], device=old_read.device)
    read.attr["output_types"].CopyFrom(type_list)
    read.attr["output_shapes"].CopyFrom(shape_list)
    log.add_node(read)


def rewire_folded(log: EditLog, view: GraphView, fits: list[FoldFit]) -> None:
    """Records, for every folded stage at once, the main side reading the new reads where it read the takes
    (a control edge on a take waits on the new read; one on another removed op goes) and the removal of the
    stages' ops, the old reads and the body. One SetInputs per node: a node may read several folded takes."""
    take_of = {fit.take: read_name(fit) for fit in fits}
    dropped = {n for fit in fits for n in (*fit.removed, *(set(fit.body) - set(fit.kept)), fit.read)}
    for name in view.names():
        if name in dropped:
            continue
        inputs = list(log.inputs_of(name))
        new = []
        for raw in inputs:
            t = parse_tensor_name(raw)
            if t.node in take_of:
                read = take_of[t.node]
                new.append(f"^{read}" if t.is_control else f"{read}:{t.port}" if t.port else read)
            elif t.node in dropped:
                if not t.is_control:  # fold_fit refused a stage whose ops are read elsewhere
                    raise AssertionError(f"node {name!r} reads {raw!r}, which the fold removes")
            else:
                new.append(raw)
        if new != inputs:
            log.set_inputs(name, dedupe_controls(new))
    for name in view.order():
        if name in dropped:
            log.remove_node(name)


def _fold_one_shot(log: EditLog, view: GraphView, fit: FoldFit, body: DatasetBody,
                   library: dict[str, function_pb2.FunctionDef], session_rewrites: bool):
    """A new dataset_factory for the one-shot iterator: the old factory's dataset, then map and prefetch.

        before:  OneShotIterator(dataset_factory=_make_dataset_1a2b)
        after:   OneShotIterator(dataset_factory=stage_dataset_fold_fn_0)   (calls _make_dataset_1a2b, then
                 map(body), prefetch(capacity); a captured table is made inside from its shared_name)
    """
    scope = f"{fit.stage}/{SCOPE}/"
    old = view.node(fit.iterator).attr["dataset_factory"].func.name
    scratch = scratch_dataset_graph(view, body, scope, lambda dataset: dataset.prefetch(fit.buffer_size),
                                    num_parallel_calls=fit.num_parallel_calls, deterministic=fit.deterministic,
                                    factory=old, rewrite_as_session=session_rewrites)
    iterator = next(n for n in scratch.graph_def.node if n.op in ONE_SHOT_ITERATORS)
    _, renamed = copy_scratch(log, scratch, library, scope.rstrip("/").replace("/", "_"), "",
                              skip=frozenset({iterator.name}))
    factory = attr_value_pb2.AttrValue()
    factory.CopyFrom(iterator.attr["dataset_factory"])
    factory.func.name = renamed.get(factory.func.name, factory.func.name)
    log.set_attr(fit.iterator, "dataset_factory", factory)
    for tensor in fit.captures:  # the factory makes the table from its shared_name: give it one
        table = view.node(parse_tensor_name(tensor).node)
        if not table.attr["shared_name"].s:
            log.set_attr(table.name, "shared_name", attr_value_pb2.AttrValue(s=table.name.encode()))
    return scratch.output_types, scratch.output_shapes


__all__ = ["AUTOTUNE", "FoldDataset", "FoldFit", "INITIALIZABLE_ITERATORS", "ONE_SHOT_ITERATORS", "SCOPE", "fold_fit",
           "fold_stage", "read_name", "rewire_folded"]
