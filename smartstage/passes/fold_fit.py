"""fold_fit: whether a stage folds into its iterator's dataset, and what moves (analysis only).

    before:  it -> IteratorGetNext -> lookup(table) -> put ~~ take -> loss      (MakeIterator(batch, it))
    after:   FoldFit(read="IteratorGetNext", iterator="it", makers=("MakeIterator",), body=("Const", "lookup"),
                     captures=("hash_table:0",), outputs=("lookup:0",), removed=("stage/buffer", ...))

The pass that applies a FoldFit is passes/fold_dataset.py (its docstring says what folds and why);
everything here reads the graph and returns data.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import types_pb2

from smartstage.config.error_codes import OUT_OF_RANGE
from smartstage.graph.op_types import (FEED_OPS, ITERATOR_READS, ORDER_FREE_STATEFUL_OPS, QUEUE_READS,
                                       READ_ONLY_TABLE_OPS, READER_READS, TABLE_READ_OPS, is_ref_dtype,
                                       is_stateful_op)
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView

SCOPE = "dataset_fold"  # <stage>/dataset_fold/<node>: the nodes this pass adds
AUTOTUNE = -1           # tf.data.AUTOTUNE, and the StageDef's AUTOTUNE
INITIALIZABLE_ITERATORS = {"IteratorV2", "Iterator", "AnonymousIterator", "AnonymousIteratorV2",
                           "AnonymousIteratorV3"}
ONE_SHOT_ITERATORS = {"OneShotIterator"}
# Ops that use an iterator besides its read and its initializers, and leave the elements alone.
_ITERATOR_USERS = {"IteratorToStringHandle", "SerializeIterator", "DeserializeIterator", "DeleteIterator"}
_UNMOVABLE_DTYPES = {types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT}
# Why do_smart_stage_gpu keeps the stage's buffer (checked on TensorFlow 2.21, v1 graph): prefetch_to_device
# and copy_to_device make the dataset a GeneratorDataset on the device, and the iterator, its MakeIterator and
# IteratorGetNext must then be placed there with it; a GeneratorDataset "does not support checkpointing", so
# the user's saveable iterator would fail to save. The GPU-resident buffer keeps the copy off the step.
GPU_REASON = ("do_smart_stage_gpu: the GPU-resident buffer keeps the host-to-device copy off the step; tf.data's "
              "prefetch_to_device moves the iterator to the device and cannot be checkpointed")


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
    keeps_buffer: bool = False       # do_smart_stage_gpu: the map folds, the stage keeps its (GPU) buffer
    skipped: str = ""                # why the stage keeps its buffer (and lanes)

    @property
    def folds(self) -> bool:
        return not self.skipped


def single_iterator_read(view: GraphView, side) -> tuple[str, str]:
    """The one tf.data iterator read of a prefetch side, or "" and why there is not exactly one (another
    input op, or several reads).

        before:  side = {IteratorGetNext, sqrt}      side = {ReaderReadV2, decode}
        after:   ("IteratorGetNext", "")             ("", "node 'ReaderReadV2' (ReaderReadV2) is not a tf.data iterator read")
    """
    other = sorted(n for n in side if view.op(n) in QUEUE_READS | READER_READS)
    reads = sorted(n for n in side if view.op(n) in ITERATOR_READS)
    if other:
        return "", f"node {other[0]!r} ({view.op(other[0])}) is not a tf.data iterator read"
    if len(reads) != 1:
        return "", f"the prefetch side has {len(reads)} iterator reads ({reads}), not one"
    return reads[0], ""


def computed_from_batch(view: GraphView, read: str, body: list[str]) -> set[str]:
    """`read` and the body nodes (in graph order) computed from it; the others (constants, table handles) do
    not depend on the batch and may stay in the graph for other readers.

        before:  it -> IteratorGetNext -> sqrt;  const -> add(sqrt, const)
        after:   {"IteratorGetNext", "sqrt", "add"}
    """
    from_batch = {read}
    for name in body:
        if any(t.node in from_batch for t in view.inputs(name)):
            from_batch.add(name)
    return from_batch


def read_elsewhere(view: GraphView, name: str, side: set[str], targets: set[str],
                   from_batch: set[str]) -> tuple[str, bool]:
    """Whether a node outside `side` (the body and the put) or a target reads body node `name`: a node computed
    from the batch then cannot move into a map (the reason); any other node is copied into the map and stays
    for its other readers (copied=True).

        before:  sqrt(batch) read by loss (main side);  const read by loss
        after:   ("is read outside the prefetch side (by 'loss')", False);  ("", True)
    """
    outside = sorted(c for c in view.consumers(name) if c not in side)
    if not outside and name not in targets:
        return "", False
    if name not in from_batch:
        return "", True
    return (f"is read outside the prefetch side (by {outside[0]!r})" if outside else
            "is a target (fetched by the training step)"), False


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
    if stage_def is None:  # a hand-made queue: a QueueRunner of the user's may run its put, and names its ops
        return skip("a stage found by the graph's shape (no StageDef: not built by staged() or auto-stage); its "
                    "queue and QueueRunner stay as the user built them")
    if stage_def.feeds:
        return skip(f"the stage has a feed_dict ({stage_def.feeds[0].placeholder}): its prefetch side is fed per batch")
    # A dataset ends only on OutOfRange and has no per-type error policy: other closed or ignored error
    # types keep their meaning on the lanes only.
    if stage_def is not None and (set(stage_def.closed_error_codes) - {OUT_OF_RANGE} or stage_def.ignored_error_codes):
        return skip(f"the stage closes on error codes {sorted(stage_def.closed_error_codes)} and ignores "
                    f"{sorted(stage_def.ignored_error_codes)}: a dataset ends on OutOfRange only and ignores no "
                    "error type; only the lanes keep that policy")
    read, why_not = single_iterator_read(view, side)
    if why_not:
        return skip(why_not)
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
    from_batch = computed_from_batch(view, read, body)
    captures, kept, inside = [], [], []
    for name in body:
        if name not in from_batch and view.op(name) in READ_ONLY_TABLE_OPS:
            captures.append(f"{name}:0")  # the map reads the table by reference; the handle op stays
            continue
        reason = _unmovable(view, name, body_set)
        if (not reason and name not in from_batch and _stateful(view.op(name))
                and not _reads_a_read_only_table(view, name)):
            reason = "is stateful and not computed from the batch (in a map it would run once per element)"
        if not reason:
            reason, copied = read_elsewhere(view, name, body_set | {stage.put}, targets, from_batch)
            if copied:
                kept.append(name)
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


def _reads_a_read_only_table(view: GraphView, name: str) -> bool:
    """Whether `name` reads a read-only table (its size, a lookup of constant keys): it gives the same value
    whenever it runs, so once per element in the map is what once per batch on the lanes gives.

        before:  hash_table -> LookupTableSizeV2     (StaticVocabularyTable.lookup's id space)
        after:   True
    """
    tables = [t for t in view.data_inputs(name) if view.dtype_of(t) == types_pb2.DT_RESOURCE]
    return view.op(name) in TABLE_READ_OPS and bool(tables) and all(view.op(t.node) in READ_ONLY_TABLE_OPS
                                                                    for t in tables)


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


__all__ = ["AUTOTUNE", "GPU_REASON", "INITIALIZABLE_ITERATORS", "ONE_SHOT_ITERATORS", "SCOPE", "FoldFit", "computed_from_batch",
           "fold_fit", "read_elsewhere", "single_iterator_read"]
