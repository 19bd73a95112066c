"""find_stages: locate every stage boundary of a graph (analysis only).

    before:  reader -> put ~~ take -> hash -> loss          (put/take share one buffer)
    after:   the same graph; ctx.stages == [StageBoundary(name="stage", put="stage/put", take="stage/take")]

A stage is found from the StageDefs the runtime writes into the graph and, without them, by the
shape of the graph:
- a FIFOQueueV2 with exactly one QueueEnqueueV2 and one QueueDequeueV2 (a hand-made queue stage);
- stock Stage/Unstage ops sharing a non-empty shared_name, exactly one of each;
- DeepRec's TensorBufferPut/TensorBufferTake sharing a shared_name, exactly one of each.
"""

from __future__ import annotations

from smartstage.graph.stages import find_stages



class FindStages:
    """Pass: finds the stage boundaries (analysis only); NoStageError when there is none."""

    name = "find_stages"
    requires = ()
    provides = ("stages",)

    def run(self, graph_def, ctx):
        from smartstage.errors import NoStageError
        from smartstage.passes.manager import PassResult

        view = ctx.view_of(graph_def)
        stages, notes = find_stages(view, ctx.stage_defs)
        ctx.stages, ctx.notes = stages, ctx.notes + notes
        from smartstage.passes.fold_dataset import SCOPE  # what fold_dataset leaves of a stage: <stage>/SCOPE/...

        folded = [] if stages else [n for n in view.names() if n.endswith(f"/{SCOPE}/IteratorGetNext")]
        if folded and not ctx.options.auto_stage:  # optimize()'s own output: running it again changes nothing
            return PassResult(graph_def, changed=False, details=stages,
                              summary=(f"0 stage(s): already folded into datasets (read by {', '.join(folded)})",))
        if not stages and not ctx.options.auto_stage:
            raise NoStageError(
                "the graph has no stage boundary (no put/take pair): wrap your parsed features with "
                "smartstage.staged(...) after the input pipeline, or turn on auto-stage "
                "(smartstage.enable_smart_stage(config, auto_stage=True))" + (f"; note: {notes[0]}" if notes else "")
            )
        summary = [f"{len(stages)} stage(s): " + ", ".join(f"{s.name} ({s.kind}, {s.origin})" for s in stages)]
        return PassResult(graph_def, changed=False, summary=tuple(summary + notes), details=stages)
