"""dataset_rules: may a stage's prefetch body move into its tf.data dataset, and what moves (analysis only).

One ordered check list decides it for both places a body moves to: the fold (passes/fold_fit.py: a map in
the trainer's own process takes the stage's place) and tf.data service (passes/tfdata_service.py: a map on a
service worker, the stage stays and reads a new iterator). A `Destination` holds what differs between them;
every check and its message is the same code for both.

    before:  it -> IteratorGetNext -> lookup(table) -> put ~~ take        (MakeIterator(batch, it))
    after:   movable_body(view, stage, side, targets, FOLD)
               -> MovableBody(read="IteratorGetNext", body=("Const", "lookup"), captures=("hash_table:0",), ...)
             movable_body(view, stage, side, targets, SERVICE)
               -> MovableBody(skipped="node 'lookup' (LookupTableFindV2) looks up a table, which lives in the
                  trainer's process")
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import types_pb2

from smartstage.config.error_codes import OUT_OF_RANGE
from smartstage.graph.op_types import (FEED_OPS, HANDLE_OPS, INITIALIZABLE_ITERATORS, ITERATOR_READS, NAMED_ITERATORS,
                                       ONE_SHOT_ITERATORS, ORDER_FREE_STATEFUL_OPS, PY_FUNC_OPS, QUEUE_READS,
                                       READ_ONLY_TABLE_OPS, READER_READS, TABLE_READ_OPS, UNFEEDABLE_DTYPES,
                                       is_ref_dtype, is_stateful_op)
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView

# Ops that use an iterator besides its read and its initializers, and leave the elements alone.
_ITERATOR_USERS = {"IteratorToStringHandle", "SerializeIterator", "DeserializeIterator", "DeleteIterator"}


@dataclass(frozen=True)
class Destination:
    """Where a prefetch body moves: what differs between the fold and tf.data service, and why.

        FOLD:     Destination("fold into a dataset", in_trainer=True, replaces_stage=True)
        SERVICE:  Destination("are rewritten", in_trainer=False, replaces_stage=False)
    """

    action: str            # what the pass does to a FIFO-queue stage (the refusal of other kinds says it)
    # The map runs in the trainer's process: read-only tables are read by reference, Python may run, and
    # order-free stateful ops (checks, prints) and control edges inside the body move with it, in a map
    # that keeps input order. Else it runs on a service worker: none of these exist there.
    in_trainer: bool
    # The dataset takes the stage's place: its buffer, lanes and StageDef leave the graph, so the StageDef's
    # policy must hold in the dataset, the iterator keeps its name and its initializers (or its one-shot
    # factory) get the map, and the put's waits move into the map. Else the put stays and reads a new
    # iterator, started beside the one MakeIterator of the user's.
    replaces_stage: bool


FOLD = Destination("fold into a dataset", in_trainer=True, replaces_stage=True)
SERVICE = Destination("are rewritten", in_trainer=False, replaces_stage=False)


@dataclass(frozen=True)
class MovableBody:
    """What of one stage's prefetch side moves into its dataset's map, or why nothing does: analysis only.

        before:  it -> IteratorGetNext -> sqrt -> put ~~ take -> loss        (MakeIterator(batch, it))
        after:   MovableBody(read="IteratorGetNext", iterator="it", makers=("MakeIterator",), body=("Sqrt",),
                             outputs=("Sqrt:0",))
    """

    read: str = ""                   # the IteratorGetNext the put reads through the body
    iterator: str = ""               # the iterator op
    makers: tuple[str, ...] = ()     # its MakeIterator ops, in graph order
    one_shot: bool = False           # a OneShotIterator (the fold only): its dataset_factory gets the map
    body: tuple[str, ...] = ()       # run inside the map, in graph order (table handles excluded: captured)
    kept: tuple[str, ...] = ()       # body nodes not computed from the batch that others read too: copied
    captures: tuple[str, ...] = ()   # table handles the map reads by reference (the fold only)
    outputs: tuple[str, ...] = ()    # the put's data inputs: what the map yields, in buffer order
    waits: tuple[str, ...] = ()      # body ops every element waits for (the fold only: checks the step waited on)
    removed: tuple[str, ...] = ()    # the stage's own ops, which leave the graph (the fold only)
    skipped: str = ""                # why the body does not move

    @property
    def moves(self) -> bool:
        return not self.skipped


def movable_body(view: GraphView, stage: StageBoundary, side: frozenset[str], targets: set[str],
                 destination: Destination) -> MovableBody:
    """Whether `stage`'s prefetch body (`side`: everything its put needs) moves into the dataset of its iterator
    at `destination`, and what moves: the checks below, in this order, the first failing one named.

        before:  it -> IteratorGetNext -> sqrt -> put ~~ take          (MakeIterator(batch, it))
        after:   MovableBody(read="IteratorGetNext", makers=("MakeIterator",), body=("Sqrt",), outputs=("Sqrt:0",))
    """
    reason = _stage_reason(stage, destination)
    if reason:
        return MovableBody(skipped=reason)
    read, reason = single_iterator_read(view, side)
    if reason:
        return MovableBody(skipped=reason)
    iterator = view.data_inputs(read)[0].node
    makers = sorted((c for c in view.consumers(iterator) if view.op(c) == "MakeIterator"), key=view.position)
    reason = _iterator_reason(view, read, iterator, makers, destination)
    if reason:
        return MovableBody(skipped=reason)
    for k, dtype in enumerate(view.output_dtypes(read) or []):
        if dtype in UNFEEDABLE_DTYPES:  # a dataset component the map cannot return as a dense tensor
            return MovableBody(skipped=f"node {read!r} output {k} is a {types_pb2.DataType.Name(dtype)} (a nested, "
                                       "sparse or ragged component); only dense components are folded")
    upstream = view.ancestors([read])
    body = [n for n in view.order() if n in side and n not in upstream and n != read]
    body_set = set(body)
    from_batch = computed_from_batch(view, read, body)
    captured, kept = set(), []
    for name in sorted(body, key=lambda n: view.op(n) in HANDLE_OPS):  # name the lookup, not the table
        if destination.in_trainer and name not in from_batch and view.op(name) in READ_ONLY_TABLE_OPS:
            captured.add(name)  # the map reads the table by reference; the handle op stays
            continue
        reason = unmovable(view, name, body_set, from_batch, destination)
        if not reason:
            reason, copied = read_elsewhere(view, name, body_set | {stage.put}, targets, from_batch)
            if copied:
                kept.append(name)  # a copy runs in the map; the original stays for its other readers
        if reason:
            return MovableBody(skipped=f"node {name!r} ({view.op(name)}) {reason}")
    outside = sorted(c for c in view.consumers(read) if c not in body_set | {stage.put})
    if outside or read in targets:
        return MovableBody(skipped=f"node {read!r} is read outside the prefetch side ({outside or 'a target'})")
    outputs = stage.put_data_inputs(view)
    for t in outputs:
        if t.node not in body_set | {read} or t.node in captured:
            return MovableBody(skipped=f"node {t.node!r} ({view.op(t.node)}) feeds the put but is " + (
                "not computed in the prefetch side's body" if destination.in_trainer else
                "upstream of the iterator read"))
    # A check the step waited on (expand_stage re-routed its control edge through the put): where the map
    # takes the stage's place, every element waits for it; where the put stays, its control edge would be lost.
    tied = sorted(set(view.control_inputs(stage.put)) & ({read} if destination.replaces_stage else body_set | {read}))
    if tied:
        return MovableBody(skipped=f"node {tied[0]!r} is a control input of the put {stage.put!r}")
    waits, removed = (), set()
    if destination.replaces_stage:
        waits = tuple(sorted(set(view.control_inputs(stage.put)) & body_set, key=view.position))
        removed = stage_ops(view, stage)
        reader = next((c for n in sorted(removed) if n != stage.take for c in view.consumers(n)
                       if c not in removed and any(t.node == n for t in view.data_inputs(c))), None)
        if reader:
            return MovableBody(skipped=f"node {reader!r} reads the stage's own op "
                                       f"{[t.node for t in view.data_inputs(reader) if t.node in removed][0]!r}"
                                       " (the buffer leaves the graph when the stage folds)")
    kept_with_inputs = (view.ancestors(kept) & body_set) | set(kept)  # a kept node's inputs stay with it
    return MovableBody(read, iterator, tuple(makers), view.op(iterator) in ONE_SHOT_ITERATORS,
                       tuple(n for n in body if n not in captured), tuple(sorted(kept_with_inputs - captured)),
                       tuple(f"{name}:0" for name in body if name in captured), tuple(str(t) for t in outputs),
                       waits, tuple(sorted(removed)))


def _stage_reason(stage: StageBoundary, destination: Destination) -> str:
    """Why the stage itself keeps its body ('' when it may move): its kind, and where the dataset takes the
    stage's place, a StageDef whose policy a dataset keeps."""
    if stage.kind != FIFO:
        return f"a {stage.kind} stage: only FIFO-queue stages {destination.action}"
    if not destination.replaces_stage:
        return ""
    stage_def = stage.stage_def
    if stage_def is None:  # a hand-made queue: a QueueRunner of the user's may run its put, and names its ops
        return ("a stage found by the graph's shape (no StageDef: not built by staged() or auto-stage); its "
                "queue and QueueRunner stay as the user built them")
    if stage_def.feeds:
        return f"the stage has a feed_dict ({stage_def.feeds[0].placeholder}): its prefetch side is fed per batch"
    # A dataset ends only on OutOfRange and has no per-type error policy: other closed or ignored error
    # types keep their meaning on the lanes only.
    if set(stage_def.closed_error_codes) - {OUT_OF_RANGE} or stage_def.ignored_error_codes:
        return (f"the stage closes on error codes {sorted(stage_def.closed_error_codes)} and ignores "
                f"{sorted(stage_def.ignored_error_codes)}: a dataset ends on OutOfRange only and ignores no "
                "error type; only the lanes keep that policy")
    return ""


def _iterator_reason(view: GraphView, read: str, iterator: str, makers: list[str], destination: Destination) -> str:
    """Why the iterator's dataset cannot take the map ('' when it can): its kind, its initializers, and
    another use that would see the mapped elements."""
    kind = view.op(iterator)
    if destination.replaces_stage:
        if kind not in INITIALIZABLE_ITERATORS | ONE_SHOT_ITERATORS:
            return (f"iterator {iterator!r} is a {kind} (iterators folded: {sorted(INITIALIZABLE_ITERATORS)} with "
                    "MakeIterator, OneShotIterator)")
        users = [c for c in view.consumers(iterator) if view.op(c) != "MakeIterator" and c != read and not (
            view.op(c) in _ITERATOR_USERS and (view.op(c) != "IteratorToStringHandle" or not view.consumers(c)))]
        if users:
            return (f"iterator {iterator!r} is used by {users[0]!r} ({view.op(users[0])}) besides {read!r}: "
                    "another read would see the folded elements")
        if kind not in ONE_SHOT_ITERATORS and not makers:
            return f"iterator {iterator!r} has no MakeIterator initializer"
        return ""
    if kind not in NAMED_ITERATORS or len(makers) != 1:
        return (f"iterator {iterator!r} ({kind}) has {len(makers)} MakeIterator initializer(s), not one (a one-shot "
                "iterator builds its dataset inside a function); use make_initializable_iterator")
    readers = [c for c in view.consumers(iterator) if view.op(c) in ITERATOR_READS]
    if readers != [read]:
        return f"iterator {iterator!r} is read by {sorted(readers)}, not only by {read!r}"
    dataset = view.data_inputs(makers[0])[0]
    served = sorted(n for n in view.ancestors([dataset.node]) if view.op(n).startswith("DataServiceDataset"))
    if served:
        return f"already distributed through tf.data service (node {served[0]!r})"
    return ""


def unmovable(view: GraphView, name: str, body: set[str], from_batch: set[str], destination: Destination) -> str:
    """Why body node `name` cannot run inside the dataset's map at `destination` ('' when it can); `from_batch`:
    the body nodes computed from the batch (computed_from_batch).

        before:  hash_table -> lookup(IteratorGetNext:0)
        after:   unmovable(view, "lookup", ..., FOLD) == ""
                 unmovable(view, "lookup", ..., SERVICE) == "looks up a table, which lives in the trainer's process"
    """
    op = view.op(name)
    if not destination.in_trainer and op in TABLE_READ_OPS:
        return "looks up a table, which lives in the trainer's process"
    if not destination.in_trainer and op in PY_FUNC_OPS:
        return "runs Python (py_func), which a service worker cannot call"
    if op in FEED_OPS:
        return "is fed per step"
    if any(is_ref_dtype(view.dtype_of(t)) or (view.dtype_of(t) == types_pb2.DT_RESOURCE and not (
            destination.in_trainer and view.op(t.node) in READ_ONLY_TABLE_OPS)) for t in view.data_inputs(name)):
        return ("reads a variable or a resource other than a read-only table" if destination.in_trainer else
                "reads a resource or variable")
    stateful = is_stateful_op(op)
    if stateful is None:
        return "is an op type this TensorFlow does not know"
    if stateful and not (destination.in_trainer and (op in ORDER_FREE_STATEFUL_OPS
                                                     or _order_free_call(view, view.node(name).attr))):
        return ("is stateful: in a parallel map its results would depend on the order its runs happen in "
                "(the stage keeps its lanes, which run it in input order)" if destination.in_trainer else
                "is stateful")
    outside = [c for c in view.control_inputs(name) if c not in body or not destination.in_trainer]
    if outside:
        return (f"has a control input from outside the prefetch body ({outside[0]!r})" if destination.in_trainer else
                f"has a control input ({outside[0]!r})")
    if name not in from_batch and _stateful(op) and not _reads_a_read_only_table(view, name):
        return "is stateful and not computed from the batch (in a map it would run once per element)"
    return ""


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


def stage_ops(view: GraphView, stage: StageBoundary) -> set[str]:
    """The own ops of `stage` (which has a StageDef), which leave the graph with its buffer: every queue op on
    the buffer (put, take, close, cancel, size, ...), the ready guard and auto-stage's stale marks (their
    queues and everything computed from them, down to the checks the take waits on), its reset, and the
    constants only they read.

        before:  stage/buffer, stage/put, stage/take, stage/close, stage/ready_buffer -> stage/ready_check
        after:   {"stage/buffer", "stage/put", "stage/take", "stage/close", "stage/ready_buffer", "stage/ready_check", ...}
    """
    stage_def = stage.stage_def
    ops = set(stage.ops)
    if stage.buffer:
        ops |= {c for c in view.consumers(stage.buffer) if any(t.node == stage.buffer for t in view.data_inputs(c))}
    guards = [stage_def.ready_buffer_node]  # the stage's own queues besides the buffer: the ready guard, stale marks
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


__all__ = ["FOLD", "SERVICE", "Destination", "MovableBody", "computed_from_batch", "movable_body", "read_elsewhere",
           "single_iterator_read", "stage_ops", "unmovable"]
