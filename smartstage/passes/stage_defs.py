"""How a pass changes a stage's StageDef: a new proto, recorded in its edit log, never an edit in place.

    before:  stage.stage_def.num_threads = 4         # the proto inside a frozen StageBoundary, seen by every holder
    after:   replace_stage_def(ctx, log, stage, with_fields(stage.stage_def, num_threads=4))

The edit log's SetStageDef is what the optimizer stores (graph.edits.stage_defs_after over every pass's edits)
and what a live session applies. The passes after this one read the stage through ctx.stages (and its partition
through ctx.partitions): both get a copy of the StageBoundary carrying the new StageDef (dataclasses.replace),
so the protos given to optimize() and the ones earlier holders kept are never written.
"""

from __future__ import annotations

import dataclasses

from smartstage.graph.edits import EditLog
from smartstage.graph.stages import StageBoundary
from smartstage.passes.manager import PassContext
from smartstage.protos import StageDef


def with_fields(stage_def: StageDef, **fields) -> StageDef:
    """A copy of `stage_def` with `fields` set (a repeated field: replaced by the given sequence).

        before:  StageDef(name="s", boundary_tensors=["a:0"], num_threads=1)
        after:   with_fields(that, boundary_tensors=["h:0", "a:0"]) -> StageDef(name="s", boundary_tensors=["h:0",
                 "a:0"], num_threads=1); `that` unchanged
    """
    copy = StageDef()
    copy.CopyFrom(stage_def)
    for name, value in fields.items():
        if isinstance(value, (list, tuple)):
            del getattr(copy, name)[:]
            getattr(copy, name).extend(value)
        else:
            setattr(copy, name, value)
    return copy


def replace_stage_def(ctx: PassContext, log: EditLog, stage: StageBoundary, stage_def: StageDef) -> StageBoundary:
    """`stage` with `stage_def`: logged (SetStageDef), and in ctx.stages and ctx.partitions for the passes after.

        before:  ctx.stages == [StageBoundary("s", ..., stage_def=old)]
        after:   ctx.stages == [StageBoundary("s", ..., stage_def=new)]; log.edits ends with SetStageDef(new)
    """
    log.set_stage_def(stage_def)
    new = dataclasses.replace(stage, stage_def=stage_def)
    ctx.stages[:] = [new if s.name == stage.name else s for s in ctx.stages]
    ctx.partitions[:] = [dataclasses.replace(p, stage=new) if p.stage.name == stage.name else p
                         for p in ctx.partitions]
    return new


__all__ = ["replace_stage_def", "with_fields"]
