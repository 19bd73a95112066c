"""auto_stage: insert a stage at every input source the training step reads that no stage covers.

    before:  iterator -> IteratorGetNext -> decode -> hash -> lookup(w) -> loss
    after:   iterator -> IteratorGetNext -> put ~~ take -> decode -> hash -> lookup(w) -> loss
             (then partition and expand_stage move decode and hash in front of the put, as for any stage)

An *input source* is an op that reads the next batch from outside the graph's dataflow: IteratorGetNext
of an iterator, the QueueDequeueMany/UpTo of a tf.compat.v1.train.batch / shuffle_batch queue, a
reader's read. Sources that read the same iterator, queue or reader are one source (one stage: a step
reads all of them together); different ones are independent and get one stage each, in graph order.

A source is staged unless it must keep its place; the reason goes to the report:
- it is already upstream of a stage's put (that stage covers it: a graph with stages keeps them);
- no target depends on it: the training step does not read it (an eval-only iterator, say);
- it is fetched directly (a target): a loop that fetches the batch itself must read it synchronously;
- it sits behind control flow, or reads an iterator chosen by a fed string handle: whether (or what)
  it reads is decided per step;
- nothing reads it.

A stage at an initializable iterator (one with MakeIterator initializers) is emptied and refilled
when an initializer runs; see smartstage.passes.stage_nodes and smartstage.runtime.hooks.reinit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tensorflow.core.framework import graph_pb2

from smartstage.errors import GraphError, NoStageError
from smartstage.graph.edits import EditLog, apply_to_graph_def, dedupe_controls
from smartstage.graph.names import CONTROL_PORT, TensorName, input_string
from smartstage.graph.view import GraphView
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.op_types import CONTROL_FLOW_OPS, FEED_OPS
from smartstage.passes.stage_nodes import StageNodes, stage_node_defs
from smartstage.passes.manager import PassContext, PassResult
from smartstage.graph.op_types import INITIALIZER_OPS, ITERATOR_READS, QUEUE_READS, RUNNER_ENQUEUE_OPS, SOURCE_OPS
from smartstage.graph.stages import missing_hook_message
from smartstage.config.options import AutoStageOptions

logger = logging.getLogger(__name__)


# Why a source keeps its place (SourceVerdict.kind).
COVERED = "covered"
NOT_READ = "not_read_by_step"
FETCHED = "fetched_directly"
CONTROL_FLOW = "control_flow"
FED = "fed"
UNUSED = "unused"
FEEDS_QUEUE = "feeds_queue"


@dataclass(frozen=True)
class InputSource:
    """The source ops that read one iterator, queue or reader (`resource`), in graph order."""

    resource: str
    kind: str  # "iterator", "queue" or "reader"
    nodes: tuple[str, ...]
    initializers: tuple[str, ...] = ()  # MakeIterator ops of the iterator: running one starts the input over

    @property
    def label(self) -> str:
        return ", ".join(repr(n) for n in self.nodes)


@dataclass(frozen=True)
class SourceVerdict:
    """What auto-stage did with one input source: `stage` inserted (kind ""), or why it kept its place."""

    source: InputSource
    stage: str = ""
    kind: str = ""
    reason: str = ""

    @property
    def staged(self) -> bool:
        return not self.kind

    def describe(self) -> str:
        if self.staged:
            return f"input source {self.source.label}: behind the new stage {self.stage!r}"
        if self.kind == COVERED:
            return f"input source {self.source.label}: already behind stage {self.stage!r} ({self.reason})"
        return f"input source {self.source.label} stays synchronous: {self.reason}"


@dataclass(frozen=True)
class InsertedStage:
    """One stage auto-stage added: its nodes (as first inserted, before any expansion) and its source."""

    name: str
    source: InputSource
    carried: tuple[str, ...]
    node_names: tuple[str, ...]
    resettable: bool


@dataclass(frozen=True)
class AutoStageReport:
    """Every input source with its verdict, and the stages inserted, in graph order."""

    verdicts: tuple[SourceVerdict, ...] = ()
    inserted: tuple[InsertedStage, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kept(self) -> tuple[SourceVerdict, ...]:
        return tuple(v for v in self.verdicts if not v.staged)


# -- analysis ---------------------------------------------------------------------------------------


def find_input_sources(view: GraphView) -> list[InputSource]:
    """Every input source of the graph, grouped by the iterator, queue or reader it reads, in graph order."""
    groups: dict[str, list[str]] = {}
    for name in view.nodes_of_type(SOURCE_OPS):
        handle = view.data_inputs(name)[:1]
        if handle:
            groups.setdefault(handle[0].node, []).append(name)
    initializers_of: dict[str, list[str]] = {}
    for name in view.nodes_of_type(INITIALIZER_OPS):
        iterator = view.data_inputs(name)[1:2]  # MakeIterator(dataset, iterator)
        if iterator:
            initializers_of.setdefault(iterator[0].node, []).append(name)
    sources = []
    for resource, nodes in groups.items():
        op = view.op(nodes[0])
        kind = "iterator" if op in ITERATOR_READS else "queue" if op in QUEUE_READS else "reader"
        initializers = initializers_of.get(resource, ()) if kind == "iterator" else ()
        sources.append(InputSource(resource, kind, tuple(nodes), tuple(dict.fromkeys(initializers))))
    return sorted(sources, key=lambda s: view.position(s.nodes[0]))


def judge_sources(view: GraphView, sources: list[InputSource], stages: list[StageBoundary],
                  targets: set[str], feeds: set[str]) -> list[SourceVerdict]:
    """Which sources get a stage, and why the others keep their place (analysis only)."""
    covering: dict[str, StageBoundary] = {}
    for stage in stages:
        for name in view.ancestors([stage.put]):
            covering.setdefault(name, stage)
    read_by_step = view.ancestors(targets) if targets else None
    verdicts = []
    for source in sources:
        verdicts.append(_judge(view, source, covering, read_by_step, targets, feeds))
    return verdicts


def _judge(view: GraphView, source: InputSource, covering: dict[str, StageBoundary], read_by_step: set[str] | None,
           targets: set[str], feeds: set[str]) -> SourceVerdict:
    def keep(kind: str, reason: str, stage: str = "") -> SourceVerdict:
        return SourceVerdict(source, stage=stage, kind=kind, reason=reason)

    for name in source.nodes:
        if name in covering:
            stage = covering[name]
            reason = f"{name!r} is upstream of its put"
            if source.initializers and not (stage.stage_def is not None and stage.stage_def.reset_node):
                reason += (f"; note that re-initialising the iterator ({', '.join(source.initializers)}) does not "
                           "empty that stage: its next steps still take batches read before")
            return keep(COVERED, reason, stage.name)
    fetched = [n for n in source.nodes if n in targets]
    if fetched:
        return keep(FETCHED, f"{fetched[0]!r} is fetched directly (a target): a loop that fetches the batch "
                             "itself, such as an eval loop, must read it in its own step")
    upstream = sorted(view.ancestors(source.nodes), key=view.position)
    for name in upstream:
        op = view.op(name)
        if op in CONTROL_FLOW_OPS:
            return keep(CONTROL_FLOW, f"it sits behind control flow ({name!r}, {op}): whether it reads a batch is "
                                      "decided in each step, so no batch can be read ahead")
    for name in upstream:
        op = view.op(name)
        if op in FEED_OPS or name in feeds:
            return keep(FED, f"it depends on the fed {name!r} ({op}), e.g. a feedable iterator's string handle: "
                             "what it reads is decided by each step's feed")
    if not any(view.fanouts(n) for n in source.nodes):
        return keep(UNUSED, "nothing reads it")
    if read_by_step is not None and not any(n in read_by_step for n in source.nodes):
        return keep(NOT_READ, "no target depends on it, so the training step does not read it (an iterator "
                              "only an eval loop reads, say); pass the eval fetches as targets to stage it too")
    enqueue = _only_feeds_queues(view, source.nodes) if read_by_step is None else ""  # else: not an ancestor
    if enqueue:
        return keep(FEEDS_QUEUE, f"it only feeds an input queue (through {enqueue!r}), which a QueueRunner fills; "
                                 "the step reads that queue's dequeue")
    return SourceVerdict(source)


def _only_feeds_queues(view: GraphView, roots: tuple[str, ...]) -> str:
    """The first enqueue op reached when everything downstream of `roots` ends in queue enqueues, else ""."""
    seen, todo, enqueue = set(roots), list(roots), ""
    while todo:
        name = todo.pop()
        consumers = view.consumers(name)
        if not consumers and name not in roots:
            return ""  # a sink the step may fetch
        for consumer in consumers:
            if view.op(consumer) in RUNNER_ENQUEUE_OPS:
                enqueue = enqueue or consumer
            elif consumer not in seen:
                seen.add(consumer)
                todo.append(consumer)
    return enqueue


# -- the edit -----------------------------------------------------------------------------------------


def _unique_scope(view: GraphView, base: str, taken: set[str]) -> str:
    """`base`, `base_1`, ...: the first name no node uses, neither as its name nor as a name scope.
    `taken` collects the scopes already chosen in this pass."""
    if not taken:  # every scope that starts like `base`: one sweep over the names
        taken.add("")
        for name in view.names():
            if name.startswith(base):
                parts = name.split("/")
                taken.update("/".join(parts[:k]) for k in range(1, len(parts) + 1))
    candidate, i = base, 0
    while candidate in taken:
        i += 1
        candidate = f"{base}_{i}"
    taken.add(candidate)
    return candidate


def _carried(view: GraphView, source: InputSource) -> list[TensorName]:
    """The source outputs some node reads, in (source, port) order: what the put carries."""
    used: dict[TensorName, None] = {}
    for name in source.nodes:
        ports = sorted({port for _, _, port in view.fanouts(name) if port != CONTROL_PORT})
        for port in ports:
            used[TensorName(name, port)] = None
    return list(used)


def _shape(view: GraphView, tensor: TensorName):
    shape = view.output_shape(tensor)
    if shape is None:
        node = view.node(tensor.node)
        if "output_shapes" in node.attr and tensor.port < len(node.attr["output_shapes"].list.shape):
            shape = node.attr["output_shapes"].list.shape[tensor.port]
    return shape


def _build(view: GraphView, source: InputSource, name: str, options: AutoStageOptions) -> StageNodes:
    carried = _carried(view, source)
    dtypes = []
    for tensor in carried:
        dtype = view.dtype_of(tensor)
        if dtype is None:
            raise GraphError(f"auto-stage: the dtype of {tensor} (op {view.op(tensor.node)}) cannot be known, so no "
                             "stage can carry it; load the op library that defines it, or stage the input by hand")
        dtypes.append(dtype)
    return stage_node_defs(
        name, [str(t) for t in carried], dtypes, [_shape(view, t) for t in carried],
        view.node(source.nodes[0]).device, options, sources=list(source.nodes),
        reset_triggers=list(source.initializers), ready_message=missing_hook_message(name))


def insert_stages(view: GraphView, chosen: list[tuple[InputSource, StageNodes]]) -> EditLog:
    """The edits that insert each stage at its source: readers of the source read the take, initializers
    first leave a stale mark. Nodes stay in topological order: a stage's other nodes go before its
    source (and before the iterator's initializers), its put right after the source."""
    log = EditLog(view)
    current: dict[str, list[str]] = {}  # the inputs of each node edited, as planned so far

    def inputs(name: str) -> list[str]:
        if name not in current:
            current[name] = list(view.raw_inputs(name))
        return current[name]

    for source, nodes in chosen:
        take = nodes.stage_def.take_node
        slot = {tensor: j for j, tensor in enumerate(nodes.stage_def.boundary_tensors)}
        for src in source.nodes:
            for consumer, index, port in view.fanouts(src):
                inputs(consumer)[index] = "^" + take if port == CONTROL_PORT else input_string(take, slot[f"{src}:{port}"])
        for initializer in source.initializers:
            inputs(initializer).append("^" + nodes.stage_def.stale_mark_node)
        first = min(source.nodes + source.initializers, key=view.position)
        for node in nodes.early:
            log.add_node(node, before=first)
        log.add_node(nodes.put, after=max(source.nodes, key=view.position))
        log.set_stage_def(nodes.stage_def)
    for name, final in current.items():
        # a control edge re-routed onto a take that is also read, or twice
        if any(s.startswith("^") for s in final) and len(set(final)) != len(final):
            final = dedupe_controls(final, drop_read=True)
        log.set_inputs(name, final)
    return log


def _sources_in_functions(graph_def: graph_pb2.GraphDef) -> list[tuple[str, str, str]]:
    return [(f.signature.name, n.name, n.op) for f in graph_def.library.function for n in f.node_def
            if n.op in SOURCE_OPS]


class AutoStage:
    """Pass: a stage at every input source the training step reads that no stage covers."""

    name = "auto_stage"
    requires = ("stages",)
    provides = ("stages", "auto_stage")

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        options = ctx.options.auto_stage
        view = ctx.view_of(graph_def)
        sources = find_input_sources(view)
        verdicts = judge_sources(view, sources, ctx.stages, ctx.targets, ctx.feeds)
        notes = [] if ctx.targets else [
            "auto-stage: no targets are known (no train_op collection, no targets=...): every input source "
            "counts as read by the training step"]
        notes += [f"input source {node!r} ({op}) inside function {fname!r} stays synchronous: it reads only when "
                  "that function runs (a tf.cond / tf.while_loop branch of control flow v2, or a tf.function)"
                  for fname, node, op in _sources_in_functions(graph_def)]
        taken: set[str] = set()
        chosen: list[tuple[InputSource, StageNodes]] = []
        final: list[SourceVerdict] = []
        for verdict in verdicts:
            if verdict.staged:
                nodes = _build(view, verdict.source, _unique_scope(view, options.name, taken), options)
                chosen.append((verdict.source, nodes))
                verdict = SourceVerdict(verdict.source, stage=nodes.name)
            final.append(verdict)
        lines = [v.describe() for v in final] + notes
        ctx.notes = ctx.notes + [v.describe() for v in final if not v.staged] + notes
        if not chosen and not ctx.stages:
            raise NoStageError(
                "the graph has no stage boundary, and auto-stage found no input source to stage"
                + (": " + "; ".join([v.describe() for v in final] + notes) if final or notes else
                   " (no IteratorGetNext, queue DequeueMany/UpTo or reader read)")
                + ". Wrap your parsed features with smartstage.staged(...) after the input pipeline")
        inserted = tuple(InsertedStage(nodes.name, source, tuple(nodes.stage_def.boundary_tensors), nodes.names,
                                       bool(source.initializers)) for source, nodes in chosen)
        report = AutoStageReport(tuple(final), inserted, tuple(notes))
        ctx.auto_stage = report
        if not chosen:
            return PassResult(graph_def, changed=False, summary=tuple(lines), details=report)
        log = insert_stages(view, chosen)
        new = apply_to_graph_def(graph_def, log.edits, view)
        for source, nodes in chosen:
            ctx.stages.append(StageBoundary(
                name=nodes.name, kind=FIFO, put=nodes.put.name, take=nodes.stage_def.take_node,
                buffer=nodes.stage_def.buffer_node,
                related=(nodes.stage_def.close_node, nodes.stage_def.cancel_node, nodes.stage_def.size_node)
                + ((f"{nodes.name}/reset_buffer",) if nodes.stage_def.reset_node else ()),
                origin="auto", stage_def=nodes.stage_def))
            extra = f"; emptied and refilled when {list(source.initializers)} run" if source.initializers else ""
            lines.append(f"{nodes.name}: inserted at {source.label}, carrying {len(nodes.stage_def.boundary_tensors)} "
                         f"tensor(s){extra}")
        logger.debug("auto_stage: inserted %s", [nodes.name for _, nodes in chosen])
        return PassResult(new, changed=True, summary=tuple(lines), details=report, edits=log.edits)
