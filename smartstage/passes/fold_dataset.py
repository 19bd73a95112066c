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

What the map carries: stateless ops, read-only table lookups (the map captures the table's handle), and
the other order-free stateful ops (Assert, Print). A stage is left as it was, with the reason in the
summary, when its prefetch side is not exactly one iterator read and a body (another input op, a random
op, a variable, a mutable table, a py_func that keeps state, a fed placeholder), when a body tensor is
read outside the prefetch side, when the stage has a feed_dict, or when the iterator is read elsewhere.
Those stages keep the lanes (docs/runtime.md).

Values: the map computes what the moved ops compute, batch for batch, in input order (deterministic=True
unless staged(deterministic=False)). One difference from a session running the same ops: the session's
Grappler rewrites the step's graph (a division by a constant becomes a multiplication by its reciprocal,
last-ulp different), and it does not rewrite a dataset's functions; the folded ops give the unrewritten
result. Flag off and on fold alike, so they agree bit for bit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2, types_pb2

from smartstage.config.error_codes import OUT_OF_RANGE
from smartstage.graph.edits import EditLog, apply_to_graph_def, dedupe_controls
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.op_types import (FEED_OPS, ITERATOR_READS, ORDER_FREE_STATEFUL_OPS, QUEUE_READS,
                                       READ_ONLY_TABLE_OPS, READER_READS, is_ref_dtype, is_stateful_op)
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.dataset_map import DatasetBody, copy_scratch, scratch_dataset_graph
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from smartstage.passes.manager import PassContext, PassResult

logger = logging.getLogger(__name__)

SCOPE = "dataset_fold"  # <stage>/dataset_fold/<node>: the nodes this pass adds
AUTOTUNE = -1           # tf.data.AUTOTUNE, and the StageDef's AUTOTUNE
INITIALIZABLE_ITERATORS = {"IteratorV2", "Iterator", "AnonymousIterator", "AnonymousIteratorV2",
                           "AnonymousIteratorV3"}
ONE_SHOT_ITERATORS = {"OneShotIterator"}
# Ops that use an iterator besides its read and its initializers, and leave the elements alone.
_ITERATOR_USERS = {"IteratorToStringHandle", "SerializeIterator", "DeserializeIterator", "DeleteIterator"}
_UNMOVABLE_DTYPES = {types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT}
# Why do_smart_stage_gpu keeps the buffer (checked on TensorFlow 2.21, v1 graph): prefetch_to_device and
# copy_to_device make the dataset a GeneratorDataset on the device, and the iterator, its MakeIterator and
# IteratorGetNext must then be placed there with it; a GeneratorDataset "does not support checkpointing", so
# the user's saveable iterator would fail to save. The GPU-resident buffer keeps the copy off the step.
GPU_REASON = ("do_smart_stage_gpu: the GPU-resident buffer keeps the host-to-device copy off the step (tf.data's "
              "prefetch_to_device moves the iterator to the device and cannot be checkpointed)")


@dataclass(frozen=True)
class FoldFit:
    """Whether one stage folds into its iterator's dataset, and what moves: analysis only.

        before:  it -> IteratorGetNext -> sqrt -> put ~~ take -> loss        (MakeIterator(batch, it))
        after:   FoldFit(read="IteratorGetNext", iterator="it", makers=("MakeIterator",), body=("Sqrt",),
                         outputs=("Sqrt:0",), removed=("stage/buffer", "stage/put", "stage/take", ...))
    """

    stage: str
    put: str = ""
    take: str = ""
    read: str = ""                   # the IteratorGetNext the put reads through the body
    iterator: str = ""               # the iterator op (keeps its name)
    makers: tuple[str, ...] = ()     # its MakeIterator ops (initializable iterators): one map per dataset
    one_shot: bool = False           # a OneShotIterator: its dataset_factory gets the map
    body: tuple[str, ...] = ()       # run inside the map, in graph order
    kept: tuple[str, ...] = ()       # body nodes not computed from the batch that others read too: copied
    captures: tuple[str, ...] = ()   # table handles the map reads by reference
    outputs: tuple[str, ...] = ()    # the put's data inputs: what the iterator yields, in order
    waits: tuple[str, ...] = ()      # body ops every element waits for (checks the step waited on)
    removed: tuple[str, ...] = ()    # the stage's own ops (buffer, put, take, guard, ...): they leave the graph
    num_parallel_calls: int = AUTOTUNE
    buffer_size: int = AUTOTUNE
    deterministic: bool = True
    skipped: str = ""                # why the stage keeps its buffer (and lanes)

    @property
    def folds(self) -> bool:
        return not self.skipped


def fold_fit(view: GraphView, stage: StageBoundary, side: frozenset[str], targets: set[str]) -> FoldFit:
    """Whether `stage` (after expand_stage) folds into its iterator's dataset; `side`: the put's prefetch side.

        before:  it -> IteratorGetNext -> lookup(table) -> put ~~ take       (MakeIterator(batch, it))
        after:   FoldFit(body=("Const", "LookupTableFindV2"), captures=("hash_table:0",), makers=("MakeIterator",))
    """
    def skip(reason: str) -> FoldFit:
        return FoldFit(stage.name, skipped=reason)

    if stage.kind != FIFO:
        return skip(f"a {stage.kind} stage: only FIFO-queue stages fold into a dataset")
    stage_def = stage.stage_def
    if stage_def is not None and stage_def.feeds:
        return skip(f"the stage has a feed_dict ({stage_def.feeds[0].placeholder}): its prefetch side is fed per batch")
    # A dataset ends only on OutOfRange and has no per-type error policy: other closed or ignored error
    # types keep their meaning on the lanes only.
    if stage_def is not None and (set(stage_def.closed_error_codes) - {OUT_OF_RANGE} or stage_def.ignored_error_codes):
        return skip(f"the stage closes on error codes {sorted(stage_def.closed_error_codes)} and ignores "
                    f"{sorted(stage_def.ignored_error_codes)}: a dataset ends on OutOfRange only and ignores no "
                    "error type; only the lanes keep that policy")
    other = sorted(n for n in side if view.op(n) in QUEUE_READS | READER_READS)
    reads = sorted(n for n in side if view.op(n) in ITERATOR_READS)
    if other or len(reads) != 1:
        return skip(f"node {other[0]!r} ({view.op(other[0])}) is not a tf.data iterator read" if other else
                    f"the prefetch side has {len(reads)} iterator reads ({reads}), not one")
    read = reads[0]
    iterator = view.data_inputs(read)[0].node
    kind = view.op(iterator)
    if kind not in INITIALIZABLE_ITERATORS | ONE_SHOT_ITERATORS:
        return skip(f"iterator {iterator!r} is a {kind} (iterators folded: {sorted(INITIALIZABLE_ITERATORS)} with "
                    "MakeIterator, OneShotIterator)")
    makers, users = [], []
    for c in view.consumers(iterator):
        if view.op(c) == "MakeIterator":
            makers.append(c)
        elif c != read and not (view.op(c) in _ITERATOR_USERS and (view.op(c) != "IteratorToStringHandle"
                                                                   or not view.consumers(c))):
            users.append(c)
    if users:
        return skip(f"iterator {iterator!r} is used by {users[0]!r} ({view.op(users[0])}) besides {read!r}: "
                    "another read would see the folded elements")
    one_shot = kind in ONE_SHOT_ITERATORS
    if not one_shot and not makers:
        return skip(f"iterator {iterator!r} has no MakeIterator initializer")
    for k, dtype in enumerate(view.output_dtypes(read) or []):
        if dtype in _UNMOVABLE_DTYPES:
            return skip(f"node {read!r} output {k} is a {types_pb2.DataType.Name(dtype)} (a nested, sparse or ragged "
                        "component); only dense components are folded")
    upstream = view.ancestors([read])
    body = [n for n in view.order() if n in side and n not in upstream and n != read]
    body_set = set(body)
    from_batch = {read}  # the body nodes computed from the batch; the others (constants, handles) may stay too
    for name in body:
        if any(t.node in from_batch for t in view.inputs(name)):
            from_batch.add(name)
    captures, kept, inside = [], [], []
    for name in body:
        if name not in from_batch and view.op(name) in READ_ONLY_TABLE_OPS:
            captures.append(f"{name}:0")  # the map reads the table by reference; the handle op stays
            continue
        reason = _unmovable(view, name, body_set)
        if not reason and name not in from_batch and _stateful(view.op(name)):
            reason = "is stateful and not computed from the batch (in a map it would run once per element)"
        outside = sorted(c for c in view.consumers(name) if c not in body_set | {stage.put})
        if not reason and (outside or name in targets):
            if name in from_batch:
                reason = (f"is read outside the prefetch side (by {outside[0]!r})" if outside else
                          "is a target (fetched by the training step)")
            else:
                kept.append(name)  # a copy runs in the map; the original stays for its other readers
        if reason:
            return skip(f"node {name!r} ({view.op(name)}) {reason}")
        inside.append(name)
    outside = sorted(c for c in view.consumers(read) if c not in body_set | {stage.put})
    if outside or read in targets:
        return skip(f"node {read!r} is read outside the prefetch side ({outside or 'a target'})")
    outputs = stage.put_data_inputs(view)
    for t in outputs:
        if t.node not in body_set | {read} or t.node in {c.split(":")[0] for c in captures}:
            return skip(f"node {t.node!r} ({view.op(t.node)}) feeds the put but is not computed in the prefetch "
                        "side's body")
    if read in view.control_inputs(stage.put):
        return skip(f"node {read!r} is a control input of the put {stage.put!r}")
    # A check the step waited on (expand_stage re-routed its control edge through the put): every element waits.
    waits = tuple(sorted(set(view.control_inputs(stage.put)) & body_set, key=view.position))
    removed = _stage_ops(view, stage)
    reader = next((c for n in sorted(removed) if n != stage.take for c in view.consumers(n)
                   if c not in removed and any(t.node == n for t in view.data_inputs(c))), None)
    if reader:
        return skip(f"node {reader!r} reads the stage's own op {[t.node for t in view.data_inputs(reader) if t.node in removed][0]!r}"
                    " (the buffer leaves the graph when the stage folds)")
    kept_with_inputs = (view.ancestors(kept) & body_set) | set(kept)  # a kept node's inputs stay with it
    threads = stage_def.num_threads if stage_def is not None and stage_def.num_threads else AUTOTUNE
    capacity = stage_def.capacity if stage_def is not None and stage_def.capacity else AUTOTUNE
    return FoldFit(stage.name, stage.put, stage.take, read, iterator, tuple(sorted(makers, key=view.position)),
                   one_shot, tuple(inside), tuple(sorted(kept_with_inputs - set(c.split(":")[0] for c in captures))),
                   tuple(captures), tuple(str(t) for t in outputs), waits, tuple(sorted(removed)),
                   num_parallel_calls=threads if threads > 0 else AUTOTUNE,
                   buffer_size=capacity if capacity > 0 else AUTOTUNE,
                   deterministic=not (stage_def is not None and stage_def.unordered))


def _stateful(op: str) -> bool:
    stateful = is_stateful_op(op)
    return stateful is None or bool(stateful)


def _unmovable(view: GraphView, name: str, body: set[str]) -> str:
    """Why body node `name` cannot run inside the dataset's map function ('' when it can)."""
    op = view.op(name)
    if op in FEED_OPS:
        return "is fed per step"
    if any(is_ref_dtype(view.dtype_of(t)) or (view.dtype_of(t) == types_pb2.DT_RESOURCE
                                              and view.op(t.node) not in READ_ONLY_TABLE_OPS)
           for t in view.data_inputs(name)):
        return "reads a variable or a resource other than a read-only table"
    stateful = is_stateful_op(op)
    if stateful is None:
        return "is an op type this TensorFlow does not know"
    if stateful and op not in ORDER_FREE_STATEFUL_OPS and not _order_free_call(view, view.node(name).attr):
        return ("is stateful: in a parallel map its results would depend on the order its runs happen in "
                "(the stage keeps its lanes, which run it in input order)")
    outside = [c for c in view.control_inputs(name) if c not in body]
    if outside:
        return f"has a control input from outside the prefetch body ({outside[0]!r})"
    return ""


def _order_free_call(view: GraphView, attrs, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a functional op (If, Case, While, a call) runs only stateless or order-free ops: the AssertGuard
    If that tf.debugging.Assert builds is stateful by type, but checks, and nothing else, whatever the order."""
    library = {f.signature.name: f for f in view.graph_def.library.function}
    called = [func.name for value in attrs.values()
              for func in ([value.func] if value.HasField("func") else list(value.list.func))]
    if not called:
        return False
    for name in called:
        if name in seen:
            continue
        function = library.get(name)
        if function is None:
            return False
        for node in function.node_def:
            stateful = is_stateful_op(node.op)
            if stateful and node.op not in ORDER_FREE_STATEFUL_OPS and not _order_free_call(view, node.attr,
                                                                                             seen | {name}):
                return False
            if stateful is None and node.op not in library:
                return False
    return True


def _stage_ops(view: GraphView, stage: StageBoundary) -> set[str]:
    """The stage's own ops, which leave the graph with its buffer: every queue op on the buffer (put, take,
    close, cancel, size, ...), the ready guard and auto-stage's stale marks (their queues and everything
    computed from them, down to the checks the take waits on), its reset, and the constants only they read."""
    stage_def = stage.stage_def
    ops = set(stage.ops)
    if stage.buffer:
        ops |= {c for c in view.consumers(stage.buffer) if any(t.node == stage.buffer for t in view.data_inputs(c))}
    guards = []  # the stage's own queues besides the buffer: the ready guard, auto-stage's stale marks
    if stage_def is not None:
        guards.append(stage_def.ready_buffer_node)
        if stage_def.stale_mark_node in view:
            guards.append(view.data_inputs(stage_def.stale_mark_node)[0].node)
        if stage_def.reset_node in view:
            ops.add(stage_def.reset_node)
    for guard in [g for g in guards if g and g in view]:
        ops.add(guard)
        frontier = [guard]
        while frontier:  # the guard is the stage's own: all of it goes
            name = frontier.pop()
            for c in view.consumers(name):
                if c not in ops and any(t.node == name for t in view.data_inputs(c)):
                    ops.add(c)
                    frontier.append(c)
    frontier = [t.node for n in ops for t in view.inputs(n)] + [c for n in ops for c in view.control_inputs(n)]
    while frontier:  # what only the removed ops read: the guard's message, its token, ...
        name = frontier.pop()
        if name in ops or name not in view or _stateful(view.op(name)):
            continue
        if all(c in ops for c in view.consumers(name)):
            ops.add(name)
            frontier.extend(t.node for t in view.inputs(name))
    return ops


class FoldDataset:
    """Folds each stage that reads a tf.data iterator into the iterator's dataset (options.tf_data_stage="fold")."""

    name = "fold_dataset"
    requires = ("stages", "partitions")
    provides = ()

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        if ctx.options.do_smart_stage_gpu:
            fits = {s.name: FoldFit(s.name, skipped=GPU_REASON) for s in ctx.stages}
            return PassResult(graph_def, changed=False, details=fits,
                              summary=tuple(f"{name}: keeps its buffer and lanes: {GPU_REASON}" for name in fits))
        sides = prefetch_sides(view, ctx.stages)
        fits = {s.name: fold_fit(view, s, sides.side.get(s.name, frozenset()), set(ctx.targets))
                for s in ctx.stages}
        summary = [f"{name}: keeps its buffer and lanes: {fit.skipped}" for name, fit in fits.items() if fit.skipped]
        chosen = [fit for fit in fits.values() if fit.folds]
        if not chosen:
            return PassResult(graph_def, changed=False, summary=tuple(summary), details=fits)
        log = EditLog(view)
        library = {f.signature.name: f for f in graph_def.library.function}
        for fit in chosen:
            fold_stage(log, view, fit, library)
            log.remove_stage_def(fit.stage)
            logger.info("stage %r: %d node(s) folded into the dataset of %r", fit.stage, len(fit.body), fit.iterator)
            summary.append(
                f"{fit.stage}: folded into the dataset of iterator {fit.iterator!r}: map({len(fit.body)} node(s), "
                f"num_parallel_calls={_setting(fit.num_parallel_calls)}, deterministic={fit.deterministic}) then "
                f"prefetch({_setting(fit.buffer_size)}); the iterator yields the {len(fit.outputs)} boundary "
                f"tensor(s), the step reads {read_name(fit)}; the buffer and its {len(fit.removed)} op(s) are gone")
        rewire_folded(log, view, chosen)
        folded = {fit.stage for fit in chosen}
        ctx.stages[:] = [s for s in ctx.stages if s.name not in folded]
        new = apply_to_graph_def(graph_def, log.edits, view)
        return PassResult(new, changed=True, summary=tuple(summary), details=fits, edits=log.edits)


def _setting(value: int) -> str:
    return "AUTOTUNE" if value == AUTOTUNE else str(value)


def read_name(fit: FoldFit) -> str:
    """The IteratorGetNext the pass adds for a folded stage: the step reads the boundary tensors from it."""
    return f"{fit.stage}/{SCOPE}/IteratorGetNext"


def fold_stage(log: EditLog, view: GraphView, fit: FoldFit, library: dict[str, function_pb2.FunctionDef]) -> None:
    """Records the fold of one stage: the map and prefetch after each dataset, the iterator's new element
    types, the new read (rewire_folded then points the main side at it and removes what the fold replaces)."""
    body = DatasetBody(fit.read, fit.body, fit.outputs, fit.captures, fit.waits)
    device = view.node(fit.read).device

    def prefetched(dataset):
        return dataset.prefetch(fit.buffer_size)

    types = shapes = None
    if fit.one_shot:
        types, shapes = _fold_one_shot(log, view, fit, body, library)
    for k, maker in enumerate(fit.makers):
        scope = f"{fit.stage}/{SCOPE}" + (f"_{k}" if k else "")
        dataset = view.raw_inputs(maker)[0]
        scratch = scratch_dataset_graph(view, body, scope + "/", prefetched, source_tensor=dataset,
                                        num_parallel_calls=fit.num_parallel_calls, deterministic=fit.deterministic,
                                        rewrite_as_session=True)
        names, _ = copy_scratch(log, scratch, library, scope.replace("/", "_"), view.node(maker).device or device)
        types, shapes = scratch.output_types, scratch.output_shapes
        end = names[parse_tensor_name(scratch.dataset).node]
        inputs = [end, *view.raw_inputs(maker)[1:]]
        log.set_inputs(maker, dedupe_controls(raw for raw in inputs if parse_tensor_name(raw).node not in fit.removed))
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
                   library: dict[str, function_pb2.FunctionDef]):
    """A new dataset_factory for the one-shot iterator: the old factory's dataset, then map and prefetch.

        before:  OneShotIterator(dataset_factory=_make_dataset_1a2b)
        after:   OneShotIterator(dataset_factory=stage_dataset_fold_fn_0)   (calls _make_dataset_1a2b, then
                 map(body), prefetch(capacity); a captured table is made inside from its shared_name)
    """
    scope = f"{fit.stage}/{SCOPE}/"
    old = view.node(fit.iterator).attr["dataset_factory"].func.name
    scratch = scratch_dataset_graph(view, body, scope, lambda dataset: dataset.prefetch(fit.buffer_size),
                                    num_parallel_calls=fit.num_parallel_calls, deterministic=fit.deterministic,
                                    factory=old, rewrite_as_session=True)
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


__all__ = ["AUTOTUNE", "FoldDataset", "FoldFit", "SCOPE", "fold_fit", "fold_stage", "read_name", "rewire_folded"]
