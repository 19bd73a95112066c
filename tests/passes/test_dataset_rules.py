"""The one rule set for "may this prefetch body move into a dataset" (passes/dataset_rules.py), on small
hand-built graphs: each case writes out what the fold (fold_fit) and the tf.data-service pass (service_fit)
decide, including the cases where the two destinations differ."""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.config.error_codes import OUT_OF_RANGE
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.dataset_rules import FOLD, SERVICE, MovableBody, movable_body
from smartstage.passes.fold_fit import fold_fit
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from smartstage.passes.tfdata_service import service_fit
from smartstage.protos import FeedDef, StageDef
from tests.builder import G, N
from tests.passes.stage_graphs import fifo_stage

F, S = tf.float32, tf.string
STAGE_OPS = ("stage/buffer", "stage/put", "stage/take")


def graph(*body, put=("sqrt",), dtypes=(F,), iterator="IteratorV2", read_types=(F, S), main=()):
    #   batch ==MakeIterator==> it -> read -> <body> -> stage/put ~~ stage/take -> out
    #                                                                  <main>: what the step reads besides
    source = [N("batch", "BatchDatasetV2"), N("it", iterator, output_types=list(read_types))]
    if iterator != "OneShotIterator":
        source.append(N("MakeIterator", "MakeIterator", ["batch", "it"]))
    return G(*source, N("read", "IteratorGetNext", ["it"], output_types=list(read_types)), *body,
             *fifo_stage(list(put), dtypes=list(dtypes)), N("out", "Identity", ["stage/take"], T=dtypes[0]), *main)


def sqrt():
    return N("sqrt", "Sqrt", ["read"], T=F)


def table():
    return [N("table", "HashTableV2", key_dtype=S, value_dtype=tf.int64), N("default", "Const", dtype=tf.int64, value=0),
            N("lookup", "LookupTableFindV2", ["table", "read:1", "default"], Tin=S, Tout=tf.int64)]


def stage_def(**fields) -> StageDef:
    return StageDef(name="stage", buffer_node="stage/buffer", put_node="stage/put", take_node="stage/take",
                    **{"closed_error_codes": [OUT_OF_RANGE], **fields})


def fold_moves(**fields) -> MovableBody:
    """What the fold moves when the body moves: the stage's own ops leave with it, and so do the stateless
    nodes only they read (here the put's input, sqrt)."""
    return MovableBody(read="read", iterator="it", makers=() if fields.get("one_shot") else ("MakeIterator",),
                       outputs=("sqrt:0",), **{"body": ("sqrt",), "removed": ("sqrt", *STAGE_OPS), **fields})


def service_moves(**fields) -> MovableBody:
    return MovableBody(read="read", iterator="it", makers=("MakeIterator",), outputs=("sqrt:0",),
                       **{"body": ("sqrt",), **fields})


FOLD_STATEFUL = ("is stateful: in a parallel map its results would depend on the order its runs happen in (the "
                 "stage keeps its lanes, which run it in input order)")

# (case, graph, the stage's StageDef (None: a hand-made queue), targets, fold's verdict, the service's verdict):
# a verdict is the MovableBody that moves, or the reason nothing moves.
CASES = [
    ("a stateless body moves to both",
     graph(sqrt()), stage_def(), {"out"},
     fold_moves(), service_moves()),
    # The fold's map runs in the trainer's process and reads the table by reference; a worker has no table.
    ("a read-only table lookup: the fold captures the table, the service refuses",
     graph(*table(), N("sqrt", "Cast", ["lookup"], SrcT=tf.int64, DstT=F)), stage_def(), {"out"},
     fold_moves(body=("default", "lookup", "sqrt"), captures=("table:0",)),
     "node 'lookup' (LookupTableFindV2) looks up a table, which lives in the trainer's process"),
    ("a stateless py_func: the fold moves it, a service worker cannot call Python",
     graph(N("sqrt", "PyFuncStateless", ["read"], Tin=[F], Tout=[F], token="pyfunc_0")), stage_def(), {"out"},
     fold_moves(), "node 'sqrt' (PyFuncStateless) runs Python (py_func), which a service worker cannot call"),
    # An Assert is stateful by type but order-free: in the trainer's ordered map it checks every element.
    ("a check inside the body: the fold keeps it with its control edge, the service refuses a stateful op",
     graph(N("zero", "Const", dtype=F, value=0.0), N("positive", "Greater", ["read", "zero"], T=F),
           N("axis", "Const", dtype=tf.int32, value=0), N("all", "All", ["positive", "axis"], Tidx=tf.int32),
           N("check", "Assert", ["all", "read"], T=[F]), N("sqrt", "Sqrt", ["read", "^check"], T=F)),
     stage_def(), {"out"},
     fold_moves(body=("zero", "positive", "axis", "all", "check", "sqrt")), "node 'check' (Assert) is stateful"),
    ("a random op: both refuse, each saying why",
     graph(N("shape", "Const", dtype=tf.int32, value=[2]), N("noise", "RandomUniform", ["shape"], dtype=F, T=tf.int32),
           N("sqrt", "AddV2", ["read", "noise"], T=F)), stage_def(), {"out"},
     f"node 'noise' (RandomUniform) {FOLD_STATEFUL}", "node 'noise' (RandomUniform) is stateful"),
    # Handle ops are checked last: the reason names the op that reads the variable, not its handle.
    ("a variable read: both refuse and name the read, not the handle",
     graph(N("w", "VarHandleOp", dtype=F, shape=[]), N("w/read", "ReadVariableOp", ["w"], dtype=F),
           N("sqrt", "Mul", ["read", "w/read"], T=F)), stage_def(), {"out"},
     "node 'w/read' (ReadVariableOp) reads a variable or a resource other than a read-only table",
     "node 'w/read' (ReadVariableOp) reads a resource or variable"),
    # The fold gives a one-shot iterator's dataset_factory the map; the service starts its chain beside
    # the user's one MakeIterator.
    ("a one-shot iterator: the fold moves the body, the service needs a MakeIterator",
     graph(sqrt(), iterator="OneShotIterator"), stage_def(), {"out"},
     fold_moves(one_shot=True),
     "iterator 'it' (OneShotIterator) has 0 MakeIterator initializer(s), not one (a one-shot iterator builds its "
     "dataset inside a function); use make_initializable_iterator"),
    # The fold takes the stage's place, so the stage must be SmartStage's and its policy one a dataset keeps;
    # the service leaves the stage (and its lanes and their policy) where they are.
    ("a hand-made queue (no StageDef): the fold leaves it, the service rewrites what its put reads",
     graph(sqrt()), None, {"out"},
     "a stage found by the graph's shape (no StageDef: not built by staged() or auto-stage); its queue and "
     "QueueRunner stay as the user built them", service_moves()),
    ("an error policy beyond end of input: the fold refuses, the service keeps the stage and its policy",
     graph(sqrt()), stage_def(closed_error_codes=[OUT_OF_RANGE, tf.errors.INVALID_ARGUMENT]), {"out"},
     f"the stage closes on error codes {sorted([OUT_OF_RANGE, tf.errors.INVALID_ARGUMENT])} and ignores []: a dataset ends on "
     "OutOfRange only and ignores no error type; only the lanes keep that policy", service_moves()),
    ("a feed_dict stage: the fold refuses the stage, the service the fed node",
     graph(N("scale", "Placeholder", dtype=F), N("sqrt", "Mul", ["read", "scale"], T=F)),
     stage_def(feeds=[FeedDef(placeholder="scale:0", tensor="scale_value:0")]), {"out"},
     "the stage has a feed_dict (scale:0): its prefetch side is fed per batch", "node 'scale' (Placeholder) is fed per step"),
    # One order for both: the read's components are checked before the body (the service named the lookup).
    ("a sparse component and a table lookup: both name the component",
     graph(*table(), N("sqrt", "Cast", ["lookup"], SrcT=tf.int64, DstT=F), read_types=(tf.variant, S)),
     stage_def(), {"out"},
     "node 'read' output 0 is a DT_VARIANT (a nested, sparse or ragged component); only dense components are folded",
     "node 'read' output 0 is a DT_VARIANT (a nested, sparse or ragged component); only dense components are folded"),
    ("the step reads the batch too: both refuse",
     graph(sqrt(), main=[N("out_read", "Identity", ["read"], T=F)]), stage_def(), {"out", "out_read"},
     "node 'read' is read outside the prefetch side (['out_read'])",
     "node 'read' is read outside the prefetch side (['out_read'])"),
    ("the step reads a body node computed from the batch: both refuse",
     graph(sqrt(), main=[N("out_sqrt", "Identity", ["sqrt"], T=F)]), stage_def(), {"out", "out_sqrt"},
     "node 'sqrt' (Sqrt) is read outside the prefetch side (by 'out_sqrt')",
     "node 'sqrt' (Sqrt) is read outside the prefetch side (by 'out_sqrt')"),
    ("a constant the step reads too: both copy it into the map and keep it",
     graph(N("scale", "Const", dtype=F, value=2.0), N("sqrt", "Mul", ["read", "scale"], T=F),
           main=[N("out_scale", "Identity", ["scale"], T=F)]), stage_def(), {"out", "out_scale"},
     fold_moves(body=("scale", "sqrt"), kept=("scale",)), service_moves(body=("scale", "sqrt"), kept=("scale",))),
    # A check the step waited on: where the map takes the stage's place every element waits for it; where
    # the put stays, its control edge would be lost with the body.
    ("a control input of the put from the body: the fold makes it a wait, the service refuses",
     graph(N("neg", "Neg", ["read"], T=F), sqrt(), put=("sqrt", "^neg")), stage_def(), {"out"},
     fold_moves(body=("neg", "sqrt"), waits=("neg",), removed=("neg", "sqrt", *STAGE_OPS)), "node 'neg' is a control input of the put 'stage/put'"),
]


def verdicts(graph_def, definition, targets):
    """(fold_fit, service_fit) of the graph's one stage: a MovableBody's fields, or the reason."""
    view = GraphView(graph_def)
    stage = StageBoundary("stage", FIFO, "stage/put", "stage/take", "stage/buffer", stage_def=definition)
    side = prefetch_sides(view, [stage]).side["stage"]
    found = []
    for fit, destination in ((fold_fit, FOLD), (service_fit, SERVICE)):
        result, moved = fit(view, stage, side, set(targets)), movable_body(view, stage, side, set(targets), destination)
        assert result.skipped == moved.skipped  # each pass decides by the shared rules
        found.append(moved.skipped or moved)
    return tuple(found)


@pytest.mark.parametrize("case, graph_def, definition, targets, fold, service", CASES, ids=[c[0] for c in CASES])
def test_fold_and_service_decide_by_one_rule_set(case, graph_def, definition, targets, fold, service):
    assert verdicts(graph_def, definition, targets) == (fold, service)


def test_a_fold_fit_carries_the_stage_defs_threads_capacity_and_order():
    #   a StageDef with num_threads=3, capacity=0 (the runtime chooses), unordered
    view = GraphView(graph(sqrt()))
    stage = StageBoundary("stage", FIFO, "stage/put", "stage/take", "stage/buffer",
                          stage_def=stage_def(num_threads=3, capacity=0, unordered=True))
    fit = fold_fit(view, stage, prefetch_sides(view, [stage]).side["stage"], {"out"})
    assert (fit.folds, fit.num_parallel_calls, fit.buffer_size, fit.deterministic) == (True, 3, -1, False)
    assert (fit.body, fit.makers, fit.outputs, fit.removed) == (("sqrt",), ("MakeIterator",), ("sqrt:0",), ("sqrt", *STAGE_OPS))
