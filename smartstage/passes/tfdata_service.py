"""tfdata_service: a stage's tf.data input and its stateless body run on tf.data service workers (opt-in).

    before:  range -> map -> batch ==MakeIterator==> it -> IteratorGetNext -> sqrt -> hash -> put ~~ take
    after:   range -> map -> batch -> stage/tfdata_service/{MapDataset(sqrt, hash) -> RegisterDatasetV2
               -> DataServiceDatasetV4} ==stage/tfdata_service/MakeIterator==> stage/tfdata_service/IteratorV2
               -> stage/tfdata_service/IteratorGetNext -> put ~~ take
             (the original MakeIterator waits for the new one: running `iterator.initializer` starts both)

It fits when the put's whole prefetch side is one `IteratorGetNext` of an initializable iterator
(`MakeIterator`) and a body of stateless ops between it and the put: no table lookups, no variables or
other resources, no py_func (a service worker is another process), nothing fed, nothing read elsewhere.
Then the body becomes the function of a `MapDataset` after the dataset, the pipeline goes to the service
with dynamic sharding (`ShardingPolicy.DYNAMIC`), and the put reads the new iterator. Where it does not
fit, the stage is left as it was and the summary names the node that prevents it.

What the service promises is weaker than the other modes: records arrive in no fixed order, the batches
are formed on each worker (not the unoptimized graph's batches), each record at most once (a worker that
dies loses what it was processing). docs/scale-out.md ("Through tf.data service") says it all; opt-in.

The new nodes are built with TensorFlow's Python API in a scratch tf.Graph (passes/dataset_map.py, shared
with fold_dataset: a placeholder stands for the dataset variant, `from_variant(...).map(...)`, here then
`.apply(distribute(...))`) and copied in, rather than written as NodeDefs: `distribute()` builds a
version-specific chain (a compression map, `RegisterDatasetV2` with a serialized metadata attr,
`DataServiceDatasetV4` with an uncompress function and nine inputs); TensorFlow's own builders get all of
that right for the installed version. Only new nodes and functions are added
(function names made deterministic); every original node keeps its name; the old read and the body are
removed, but for constants (nodes not computed from the batch) that other nodes read too: those stay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tensorflow.core.framework import function_pb2, graph_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def
from smartstage.graph.op_types import ITERATOR_READS
from smartstage.graph.stages import StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.dataset_map import DatasetBody, ScratchDataset, copy_scratch, scratch_dataset_graph
from smartstage.passes.dataset_rules import SERVICE, movable_body
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from smartstage.passes.manager import PassContext, PassResult

logger = logging.getLogger(__name__)

SCOPE = "tfdata_service"          # <stage>/tfdata_service/<node>: the nodes this pass adds
PROCESSING_MODE = "dynamic"       # tf.data.experimental.service.ShardingPolicy.DYNAMIC


@dataclass(frozen=True)
class ServiceFit:
    """Whether one stage's input can go to tf.data service, and what moves: analysis only."""

    stage: str
    put: str = ""
    read: str = ""                   # the IteratorGetNext the put reads through the body
    maker: str = ""                  # the iterator's MakeIterator (its initializer)
    dataset: str = ""                # the tensor MakeIterator reads: the dataset the service runs
    body: tuple[str, ...] = ()       # folded into the map, in graph order
    kept: tuple[str, ...] = ()       # body nodes not computed from the batch that others read too: copied
    outputs: tuple[str, ...] = ()    # the put's data inputs, in buffer order
    skipped: str = ""                # why the stage stays as it is


def service_fit(view: GraphView, stage: StageBoundary, side: frozenset[str], targets: set[str]) -> ServiceFit:
    """Which nodes of `stage`'s prefetch side fold into the dataset's map, or why none can (the checks are
    passes/dataset_rules.py's, at its SERVICE destination).

        before:  it -> IteratorGetNext -> sqrt -> put          (MakeIterator(batch, it))
        after:   ServiceFit(read="IteratorGetNext", maker="MakeIterator", dataset="batch", body=("sqrt",))
    """
    moved = movable_body(view, stage, side, targets, SERVICE)
    if not moved.moves:
        return ServiceFit(stage.name, skipped=moved.skipped)
    (maker,) = moved.makers
    return ServiceFit(stage.name, stage.put, moved.read, maker, view.raw_inputs(maker)[0], moved.body, moved.kept,
                      moved.outputs)


class TfDataService:
    """Folds each fitting stage's body into its dataset and distributes it through tf.data service."""

    name = "tfdata_service"
    requires = ("stages",)
    provides = ()

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        address = ctx.options.tf_data_service
        view = ctx.view_of(graph_def)
        sides = prefetch_sides(view, ctx.stages)
        fits = {s.name: service_fit(view, s, sides.side.get(s.name, frozenset()), set(ctx.targets))
                for s in ctx.stages}
        summary = [f"{name}: left as it was: {fit.skipped}" for name, fit in fits.items() if fit.skipped]
        chosen = [fit for fit in fits.values() if not fit.skipped]
        if not chosen:
            return PassResult(graph_def, changed=False, summary=tuple(summary), details=fits)
        log = EditLog(view)
        library = {f.signature.name: f for f in graph_def.library.function}
        for fit in chosen:
            _fold(log, view, fit, address, library)
            logger.info("stage %r: %d body node(s) folded into its dataset, distributed to %s", fit.stage,
                        len(fit.body), address)
            summary.append(f"{fit.stage}: {len(fit.body)} body node(s) folded into the dataset's map, the pipeline "
                           f"distributed to tf.data service at {address} ({PROCESSING_MODE} sharding: each record at "
                           f"most once, order and batches not the unoptimized graph's); running {fit.maker!r} "
                           f"starts it; the put reads {fit.stage}/{SCOPE}/IteratorGetNext")
        new = apply_to_graph_def(graph_def, log.edits, view)
        return PassResult(new, changed=True, summary=tuple(summary), details=fits, edits=log.edits)


def _fold(log: EditLog, view: GraphView, fit: ServiceFit, address: str,
          library: dict[str, function_pb2.FunctionDef]) -> None:
    """Records the service chain and its iterator for `fit`, the put and the initializer rewired, the body
    dropped. `library`: the functions the graph has, with those added so far (updated here)."""
    scratch = _service_graph(view, fit, address, f"{fit.stage}/{SCOPE}/")
    dropped = set(fit.body) - set(fit.kept) | {fit.read}
    for name in view.names():
        if name in dropped:
            log.remove_node(name)
    # The old read's device: the new iterator and its chain run where it ran.
    copy_scratch(log, scratch, library, f"{fit.stage}_{SCOPE}", view.node(fit.read).device)
    maker = next(n.name for n in scratch.graph_def.node if n.op == "MakeIterator")
    read = next(n.name for n in scratch.graph_def.node if n.op in ITERATOR_READS)
    log.set_inputs(fit.maker, [*log.inputs_of(fit.maker), f"^{maker}"])
    put = list(log.inputs_of(fit.put))
    data = [k for k, raw in enumerate(put) if not raw.startswith("^")][1:]  # after the queue handle
    for k, position in enumerate(data):
        put[position] = f"{read}:{k}"
    log.set_inputs(fit.put, put)


def _service_graph(view: GraphView, fit: ServiceFit, address: str, scope: str) -> ScratchDataset:
    """A scratch graph (passes/dataset_map.py): the dataset -> map(body) -> distribute -> iterator.

        before:  body {sqrt(IteratorGetNext:0)}, outputs ("sqrt:0", "IteratorGetNext:1")
        after:   <scope>MapDataset (f: import of the body), RegisterDatasetV2, DataServiceDatasetV4,
                 <scope>IteratorV2, <scope>MakeIterator, <scope>IteratorGetNext
    """
    import tensorflow as tf  # the Python API only here: the analysis above reads protos

    def distributed(dataset):
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=address))
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        iterator.get_next()
        return dataset

    return scratch_dataset_graph(view, DatasetBody(fit.read, fit.body, fit.outputs), scope, distributed,
                                 source_tensor=fit.dataset)


__all__ = ["TfDataService", "ServiceFit", "service_fit", "SCOPE", "PROCESSING_MODE"]
