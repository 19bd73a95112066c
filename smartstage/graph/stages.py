"""The stage model: a stage boundary (one bounded buffer and its put, take, close and cancel ops) and how
to find every one in a graph. Every layer above shares it: the passes, the session, inspection.

    stages, notes = find_stages(GraphView(graph_def), stage_defs)
    stages[0].put, stages[0].take        # ("stage/put", "stage/take")

A boundary of kind INPUTS is a graph's own inputs (a TF2 step's placeholders): no buffer, put or take in the
graph; its input nodes play the take's role, and `carries` names what it hands to the main side.

    input_boundary("inputs", ("batch", "batch_1")).take_nodes   # ("batch", "batch_1")
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from smartstage.errors import GraphError
from smartstage.graph.names import TensorName, parse_tensor_name
from smartstage.graph.view import GraphView
from smartstage.protos import StageDef
from smartstage.graph.op_types import DEQUEUE_OPS, ENQUEUE_OPS, QUEUE_OPS, QUEUE_USER_OPS, STAGING_OPS, TENSOR_BUFFER_OPS


FIFO = "fifo_queue"


STAGING_AREA = "staging_area"


TENSOR_BUFFER = "tensor_buffer"


INPUTS = "inputs"


_KIND_OF_PROTO = {StageDef.FIFO_QUEUE: FIFO, StageDef.STAGING_AREA: STAGING_AREA, StageDef.TENSOR_BUFFER: TENSOR_BUFFER}


PROTO_OF_KIND = {v: k for k, v in _KIND_OF_PROTO.items()}


@dataclass(frozen=True)
class StageBoundary:
    """One stage: its buffer, put and take, and every other op of the same buffer."""

    name: str
    kind: str
    put: str
    take: str
    buffer: str = ""
    related: tuple[str, ...] = ()  # close, cancel, size, peek, clear ... of the same buffer
    origin: str = "structural"
    stage_def: StageDef | None = field(default=None, compare=False)
    # Kind INPUTS only: the graph's input nodes, and what the boundary hands to the main side, as a put's
    # inputs would name it ("node:port" tensors, "^node" for what the main side waits for).
    inputs: tuple[str, ...] = ()
    carries: tuple[str, ...] = ()

    @property
    def ops(self) -> tuple[str, ...]:
        """Every node that belongs to the boundary itself."""
        return tuple(n for n in (self.buffer, self.put, self.take) if n) + self.related + self.inputs

    @property
    def take_nodes(self) -> tuple[str, ...]:
        """The nodes whose readers are downstream of the boundary: the take, or a graph's input nodes."""
        return self.inputs if self.kind == INPUTS else (self.take,)

    def put_data_inputs(self, view: GraphView) -> list[TensorName]:
        """The tensors the put carries, in buffer order (a queue's handle input excluded); for INPUTS, the
        data tensors of `carries`."""
        if self.kind == INPUTS:
            return [parse_tensor_name(t) for t in self.carries if not t.startswith("^")]
        inputs = view.data_inputs(self.put)
        return inputs[1:] if self.kind == FIFO else inputs


def input_boundary(name: str, inputs: tuple[str, ...]) -> StageBoundary:
    """The boundary at a graph's inputs: each input node stands for its own output 0, which crosses as it is.

        before:  batch -> hash -> lookup(w)               (batch: a TF2 step's Placeholder)
        after:   input_boundary("inputs", ("batch",)).carries == ("batch:0",)
    """
    inputs = tuple(inputs)
    return StageBoundary(name=name, kind=INPUTS, put="", take="", origin="inputs", inputs=inputs,
                         carries=tuple(f"{n}:0" for n in inputs))


def _shared_name(node) -> tuple[bytes, bytes]:
    return node.attr["container"].s if "container" in node.attr else b"", node.attr["shared_name"].s if "shared_name" in node.attr else b""


def _from_stage_def(view: GraphView, sd: StageDef) -> StageBoundary:
    for field_name in ("put_node", "take_node"):
        value = getattr(sd, field_name)
        if value not in view:
            raise GraphError(
                f"stage {sd.name!r}: its StageDef names {field_name}={value!r}, but the graph has no such node; "
                "the graph was pruned or renamed after staged(): export the whole graph, or drop the stale "
                "'smartstage_stages' collection entry"
            )
    kind = _KIND_OF_PROTO.get(sd.kind, FIFO)
    related = tuple(
        n for n in (sd.close_node, sd.cancel_node, sd.size_node) if n and n in view
    )
    if sd.reset_node and sd.reset_node in view:  # auto-stage: what empties the buffer belongs to the stage
        related += tuple(c for c in view.control_inputs(sd.reset_node)
                         if any(t.node == sd.buffer_node for t in view.data_inputs(c)))
    if kind != FIFO:
        related += tuple(n for n in _same_buffer_ops(view, sd.put_node) if n not in (sd.put_node, sd.take_node))
    return StageBoundary(
        name=sd.name or sd.take_node.rsplit("/", 1)[0],
        kind=kind,
        put=sd.put_node,
        take=sd.take_node,
        buffer=sd.buffer_node if sd.buffer_node in view else "",
        related=tuple(dict.fromkeys(related)),
        origin=sd.origin or "staged",
        stage_def=sd,
    )


def _same_buffer_ops(view: GraphView, put: str) -> list[str]:
    key = _shared_name(view.node(put))
    family = STAGING_OPS if view.op(put) == "Stage" else TENSOR_BUFFER_OPS
    return [n for n in view.nodes_of_type(family) if _shared_name(view.node(n)) == key]


def find_stages(view: GraphView, stage_defs: list[StageDef] = ()) -> tuple[list[StageBoundary], list[str]]:
    """Every stage boundary of the graph, ordered by where its take sits; plus notes on near-misses."""
    pos = _position(view)
    stages: list[StageBoundary] = [_from_stage_def(view, sd) for sd in stage_defs]
    claimed = {n for s in stages for n in s.ops}
    notes: list[str] = []

    queue_uses: dict[str, list[str]] = {q: [] for q in view.nodes_of_type(QUEUE_OPS)}
    for user in view.nodes_of_type(QUEUE_USER_OPS):
        handle = view.inputs(user)[:1]
        if handle and handle[0].node in queue_uses:
            queue_uses[handle[0].node].append(user)
    buffers: dict[tuple[str, bytes, bytes], list[str]] = defaultdict(list)
    for name in view.nodes_of_type(STAGING_OPS | TENSOR_BUFFER_OPS):
        family = "stage" if view.op(name) in STAGING_OPS else "buffer"
        buffers[(family,) + _shared_name(view.node(name))].append(name)

    for queue in sorted(queue_uses, key=pos):
        if queue in claimed:
            continue
        uses = queue_uses[queue]
        puts = [u for u in uses if view.op(u) in ENQUEUE_OPS]
        takes = [u for u in uses if view.op(u) in DEQUEUE_OPS]
        others = [u for u in uses if u not in puts and u not in takes]
        if len(puts) == 1 and len(takes) == 1 and all(view.op(u).startswith("Queue") and "Many" not in view.op(u)
                                                      and "UpTo" not in view.op(u) for u in others):
            stages.append(StageBoundary(name=queue.rsplit("/", 1)[0] if "/" in queue else queue, kind=FIFO,
                                        put=puts[0], take=takes[0], buffer=queue, related=tuple(others)))

    for (family, container, shared), members in sorted(buffers.items(), key=lambda kv: pos(kv[1][0])):
        if any(m in claimed for m in members):
            continue
        put_op, take_op = ("Stage", "Unstage") if family == "stage" else ("TensorBufferPut", "TensorBufferTake")
        puts = [m for m in members if view.op(m) == put_op]
        takes = [m for m in members if view.op(m) == take_op]
        if not puts or not takes:
            continue
        if family == "stage" and not shared:
            notes.append(
                f"{puts[0]!r} and {takes[0]!r} are Stage/Unstage ops with an empty shared_name: each op gets its own "
                "buffer, so they are not a stage; give both the same shared_name (tf StagingArea does this)"
            )
            continue
        if len(puts) != 1 or len(takes) != 1:
            notes.append(f"buffer {shared.decode()!r} has {len(puts)} puts and {len(takes)} takes; only a 1:1 pair "
                         "is a stage SmartStage can rebuild")
            continue
        kind = STAGING_AREA if family == "stage" else TENSOR_BUFFER
        related = tuple(m for m in members if m not in (puts[0], takes[0]))
        stages.append(StageBoundary(name=shared.decode() or takes[0], kind=kind, put=puts[0], take=takes[0],
                                    related=related))

    stages.sort(key=lambda s: pos(s.take))
    return stages, notes


def _position(view: GraphView):
    return view.position


def missing_hook_message(stage: str) -> str:
    return (
        f"SmartStage stage '{stage}' has no prefetch threads, so this step would wait forever for "
        f"its next batch. Add smartstage.make_prefetch_hook() to the hooks of your "
        f"MonitoredTrainingSession, or call smartstage.start_prefetch_threads(sess) after creating "
        f"a plain Session, before running a step that reads from '{stage}'. If you did, the graph "
        f"lost its stage descriptions (collection 'smartstage_stages'): load it with "
        f"tf.compat.v1.train.import_meta_graph, not import_graph_def. If SmartStage folded the stage into its "
        f"tf.data dataset, the step reads its batch elsewhere and this fetch (a hook's, say) of what staged() "
        f"returned cannot be served in a stock session: use smartstage.MonitoredTrainingSession, which maps it."
    )


def stale_message(stage: str, triggers: list[str]) -> str:
    return (
        f"SmartStage stage '{stage}' may hold batches read before its iterator was (re-)initialised by "
        f"{', '.join(repr(t) for t in triggers)}, or the iterator was never initialised: the initializer ran "
        "where SmartStage could not see it, so the stage was not emptied. Run iterator initializers through "
        "smartstage.Session, through a MonitoredTrainingSession with smartstage.make_prefetch_hook(), or with "
        "smartstage.runtime.run_initializer(sess, threads, initializer) on a plain Session: the stage is then "
        "emptied and refilled from the new iterator."
    )
