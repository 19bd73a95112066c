"""multi_stream: tags each stage's prefetch side with its GPU stream, `_stream_id`, the way DeepRec does.

    before:  reader -> hash -> put ~~ take -> lookup(w)
    after:   reader{_stream_id: 1} -> hash{_stream_id: 1} -> put{_stream_id: 1} ~~ take -> lookup(w)

With `stage_multi_stream`, DeepRec's StageMultiStreamPass walks back from each stage's put and writes
the put's stream id on every node it reaches, so its GPU multi-stream executor launches the prefetch
side's kernels and copies on a stream of their own, beside the training step's. This pass writes the
same attribute on the same nodes, in the GraphDef: the put and every node of its prefetch side (the
put's ancestors, not crossing any buffer). The id is the stage's StageDef.stage_subgraph_stream_id
(`staged(stage_subgraph_stream_id=...)`), else a `_stream_id` already on the put, else 0.

Two differences from DeepRec, both on purpose:
- A node the main side evaluates too (a constant both sides read) is not tagged: its kernels belong to
  the training step as much as to the prefetch run. (gpu_placement gives the prefetch side its own
  copies of such nodes first; the copies are tagged.)
- A node on the prefetch sides of two stages with different ids is not tagged; the report names it.

Stock TensorFlow ignores `_stream_id` (an attribute starting with "_" is kept and never checked); only a
runtime with per-node streams (DeepRec's) acts on it. The pass is for graphs headed there, and for
inspecting what such a runtime would do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tensorflow.core.framework import attr_value_pb2, graph_pb2

from smartstage.graph.edits import EditLog, apply_to_graph_def
from smartstage.graph.stages import StageBoundary
from smartstage.passes.manager import PassContext, PassResult
from smartstage.passes.gpu.prefetch_sides import prefetch_sides

STREAM_ATTR = "_stream_id"


@dataclass(frozen=True)
class StageStreams:
    """What the pass did to one stage, as data."""

    stage: str
    stream_id: int
    source: str                 # where the id came from: "StageDef", "put attribute" or "default"
    tagged: tuple[str, ...]     # nodes whose _stream_id was set or changed
    already: int                # nodes that had the right _stream_id already
    overwritten: tuple[tuple[str, int], ...]  # (node, the _stream_id it had before)
    skipped: tuple[tuple[str, str], ...]      # (node, why it is not tagged)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary_line(self) -> str:
        line = (f"{self.stage}: stream {self.stream_id} ({self.source}): tagged {len(self.tagged)} node(s) with "
                f"{STREAM_ATTR}" + (f", {self.already} had it already" if self.already else ""))
        if self.overwritten:
            line += f"; replaced another stream id on {len(self.overwritten)}"
        if self.skipped:
            line += f"; left {len(self.skipped)} untagged (e.g. {self.skipped[0][0]}: {self.skipped[0][1]})"
        return line


def stream_id_of(stage: StageBoundary, put_node) -> tuple[int, str]:
    if stage.stage_def is not None:
        return int(stage.stage_def.stage_subgraph_stream_id), "StageDef"
    if STREAM_ATTR in put_node.attr:
        return int(put_node.attr[STREAM_ATTR].i), "put attribute"
    return 0, "default"


class MultiStream:
    """Pass: writes `_stream_id` on the put and the prefetch side of every stage."""

    name = "multi_stream"
    requires = ("stages",)
    provides = ("multi_stream",)

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
        view = ctx.view_of(graph_def)
        stages = list(ctx.stages)
        sides = prefetch_sides(view, stages)
        ids = {s.name: stream_id_of(s, view.node(s.put)) for s in stages}
        wanted: dict[str, int] = {}
        reports = []
        for stage in stages:
            stream, source = ids[stage.name]
            tagged, overwritten, skipped = [], [], []
            already = 0
            for name in [stage.put, *sorted(sides.side[stage.name])]:
                if name in sides.shared:
                    skipped.append((name, "the main side evaluates it too"))
                    continue
                owners = sides.owners.get(name, ())
                others = {ids[o][0] for o in owners} if len(owners) > 1 else ()
                if len(others) > 1:
                    skipped.append((name, f"it is on the prefetch sides of stages with streams {sorted(others)}"))
                    continue
                if name in wanted:
                    continue  # tagged for an earlier stage with the same id
                node = view.node(name)
                if STREAM_ATTR in node.attr and node.attr[STREAM_ATTR].i == stream:
                    already += 1
                    continue
                if STREAM_ATTR in node.attr:
                    overwritten.append((name, int(node.attr[STREAM_ATTR].i)))
                wanted[name] = stream
                tagged.append(name)
            reports.append(StageStreams(stage.name, stream, source, tuple(tagged), already, tuple(overwritten),
                                        tuple(skipped)))
        ctx.multi_stream = {r.stage: r for r in reports}
        summary = [r.summary_line() for r in reports]
        summary.append(f"{STREAM_ATTR} is read by DeepRec's multi-stream runtime; stock TensorFlow ignores it")
        if not wanted:
            return PassResult(graph_def, changed=False, summary=tuple(summary), details=tuple(reports))
        log = EditLog(view)
        for name in sorted(wanted, key=view.position):
            log.set_attr(name, STREAM_ATTR, attr_value_pb2.AttrValue(i=wanted[name]))
        return PassResult(apply_to_graph_def(graph_def, log.edits, view), changed=True, summary=tuple(summary),
                          details=tuple(reports), edits=log.edits)


__all__ = ["MultiStream", "STREAM_ATTR", "StageStreams", "stream_id_of"]
