"""A pass changes a StageDef by recording a new one (passes/stage_defs.py): the given proto is never written, the
edit log carries the new one, and the passes after it see it through ctx.stages and ctx.partitions."""

from __future__ import annotations

import tensorflow as tf

from smartstage.config.options import SmartStageOptions
from smartstage.graph.edits import EditLog, SetStageDef, stage_defs_after
from smartstage.graph.stages import FIFO, StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.manager import PassContext, PassManager, PassResult
from smartstage.passes.partition import StagePartition
from smartstage.passes.stage_defs import replace_stage_def, with_fields
from smartstage.protos import StageDef
from tests.builder import G, N


def small():
    #   x -> y
    return G(N("x", "Const", dtype=tf.float32, value=1.0), N("y", "Identity", ["x"], T=tf.float32))


def boundary(name: str, stage_def: StageDef | None) -> StageBoundary:
    return StageBoundary(name=name, kind=FIFO, put=f"{name}/put", take=f"{name}/take", stage_def=stage_def)


def test_with_fields_copies_and_sets_scalars_and_repeated_fields():
    given = StageDef(name="s", boundary_tensors=["a:0"], num_threads=1, capacity=4)
    new = with_fields(given, boundary_tensors=["h:0", "a:0"], num_threads=3)
    assert (list(new.boundary_tensors), new.num_threads, new.capacity, new.name) == (["h:0", "a:0"], 3, 4, "s")
    assert (list(given.boundary_tensors), given.num_threads) == (["a:0"], 1)


def test_replace_stage_def_updates_the_stages_the_partitions_and_the_log_not_the_given_proto():
    given, other = StageDef(name="s", num_threads=1), StageDef(name="t", num_threads=1)
    s, t = boundary("s", given), boundary("t", other)
    ctx = PassContext(options=SmartStageOptions(do_smart_stage=True), stage_defs=[given, other])
    ctx.stages = [s, t]
    ctx.partitions = [StagePartition(stage=s), StagePartition(stage=t)]
    log = EditLog(GraphView(small()))
    new = replace_stage_def(ctx, log, s, with_fields(given, num_threads=4))
    assert ctx.stages == [new, t] and ctx.stages[0].stage_def.num_threads == 4 and ctx.stages[1] is t
    assert [p.stage.stage_def.num_threads for p in ctx.partitions] == [4, 1] and ctx.partitions[1].stage is t
    assert given.num_threads == 1
    assert [type(e) for e in log.edits] == [SetStageDef]
    assert [(d.name, d.num_threads) for d in stage_defs_after(ctx.stage_defs, log.edits)] == [("s", 4), ("t", 1)]


class NewStageDef:
    """A pass that changes a StageDef the recorded way, declaring no `updates`."""

    name, requires, provides = "new_stage_def", (), ()

    def run(self, graph_def, ctx):
        log = EditLog(ctx.view_of(graph_def))
        replace_stage_def(ctx, log, ctx.stages[0], with_fields(ctx.stages[0].stage_def, capacity=7))
        return PassResult(graph_def, changed=False, edits=log.edits)


def test_the_pass_contract_accepts_a_recorded_stage_def_without_updates():
    given = StageDef(name="s", capacity=2)
    ctx = PassContext(options=SmartStageOptions(do_smart_stage=True), stage_defs=[given])
    ctx.stages = [boundary("s", given)]
    _, (report,) = PassManager([NewStageDef()]).run(small(), ctx)
    assert (given.capacity, ctx.stages[0].stage_def.capacity) == (2, 7)
    assert [d.capacity for d in stage_defs_after(ctx.stage_defs, report.edits)] == [7]
