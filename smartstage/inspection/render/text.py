"""The plain-text form of a GraphDiff: what `smartstage diff` prints.

    graph diff: 8 nodes -> 8 nodes
      moved 1, pinned 1, added 0, removed 0, rewired 3, op changes 0, device changes 0, attribute changes 3

    stage 'q' (fifo_queue; put 'put', take 'take')
      prefetch side: 1 -> 2 node(s); boundary: 1 -> 1 tensor(s)
      moved to the prefetch side (1):
        hash (StringToHashBucketFast)
      ...

Empty sections are left out; each list shows at most `limit` entries (None: all) and says how many more.
"""

from __future__ import annotations

from smartstage.graph.stages import INPUTS
from smartstage.inspection.diff import GraphDiff, StageDiff
from smartstage.inspection.placement import placement_lines


def text_report(diff: GraphDiff, limit: int | None = 40, pinned_limit: int | None = -1) -> str:
    """The report as text; `limit` entries per list (None: all), `pinned_limit` for pinned lists (-1: `limit`)."""
    c = diff.counts()
    lines = [
        f"graph diff: {diff.before_nodes} nodes -> {diff.after_nodes} nodes",
        f"  moved {c['moved']}, pinned {c['pinned'] if diff.has_pins else '?'}, added {c['added']}, "
        f"removed {c['removed']}, rewired {c['rewired']}, op changes {c['op_changes']}, "
        f"device changes {c['device_changes']}, attribute changes {c['attr_changes']}",
    ]
    if not diff.stages:
        lines.append("  no stage in either graph: nothing can have moved")
    if diff.is_empty:
        lines.append("  the graphs are identical")
    for stage in diff.stages:
        lines.append("")
        lines.extend(_stage_lines(diff, stage, limit, limit if pinned_limit == -1 else pinned_limit))
    if diff.placement:  # scale-out: which input task runs what (docs/scale-out.md)
        lines.append("")
        lines.append(f"placement on input tasks ({len(diff.placement)} stage(s)):")
        lines.extend("  " + line for line in placement_lines(diff.placement))
    sections = [
        ("added", [f"{n.name} ({n.op})" + (f" on {n.device}" if n.device else "") for n in diff.added]),
        ("removed", [f"{n.name} ({n.op})" for n in diff.removed]),
        ("rewired inputs", [f"{r.name}: {_inputs(r.before)} -> {_inputs(r.after)}" for r in diff.rewired]),
        ("op changes", [f"{v.name}: {v.before} -> {v.after}" for v in diff.op_changes]),
        ("device changes", [f"{v.name}: {v.before or '(none)'} -> {v.after or '(none)'}" for v in diff.device_changes]),
        ("attribute changes", [f"{a.name}.{a.attr}: {_value(a.before)} -> {_value(a.after)}"
                               for a in diff.attr_changes]),
    ]
    for title, items in sections:
        if items:
            lines.append("")
            lines.append(f"{title} ({len(items)}):")
            lines.extend(_limited(items, limit, "  "))
    if diff.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in diff.notes)
    return "\n".join(lines) + "\n"


def _stage_lines(diff: GraphDiff, stage: StageDiff, limit: int | None, pinned_limit: int | None) -> list[str]:
    where = ("" if stage.in_before and stage.in_after else
             " [only in the after graph]" if stage.in_after else
             f" [folded into its dataset: the step reads {stage.folded_into!r}]" if stage.folded_into else
             " [only in the before graph]")
    what = "the graph's inputs" if stage.kind == INPUTS else f"{stage.kind}; put {stage.put!r}, take {stage.take!r}"
    lines = [f"stage {stage.name!r} ({what}){where}"]
    lines.append(f"  prefetch side: {stage.prefetch_nodes_before} -> {stage.prefetch_nodes_after} node(s); "
                  f"boundary: {len(stage.boundary_before)} -> {len(stage.boundary_after)} tensor(s)")
    if stage.skipped:
        lines.append(f"  unchanged: {stage.skipped}")
    lines.append("  boundary before: " + _joined(stage.boundary_before, limit))
    lines.append("  boundary after:  " + _joined(stage.boundary_after, limit))
    to_prefetch = diff.moved_in(stage.name, "prefetch")
    to_main = diff.moved_in(stage.name, "main")
    if to_prefetch:
        lines.append(f"  moved to the prefetch side ({len(to_prefetch)}):")
        lines.extend(_limited([f"{m.name} ({m.op})" for m in to_prefetch], limit, "    "))
    if to_main:
        lines.append(f"  moved off the prefetch side ({len(to_main)}):")
        lines.extend(_limited([f"{m.name} ({m.op})" + ("" if m.side_after == "main" else f" -> {m.side_after}")
                               for m in to_main], limit, "    "))
    pinned = diff.pinned_in(stage.name)
    if pinned:
        lines.append(f"  pinned on the main side ({len(pinned)}):")
        lines.extend(_limited([f"{p.name} ({p.op}): {p.reason}" + _chain(diff.chain(p.name, p.stage)) for p in pinned],
                              pinned_limit, "    "))
    if stage.control_reroutes:
        lines.append(f"  control edges re-routed through the put and the take ({len(stage.control_reroutes)}):")
        lines.extend(_limited([f"{a} -> {b}" for a, b in stage.control_reroutes], limit, "    "))
    return lines


def _chain(chain: tuple[str, ...]) -> str:
    """The pin chain, node first; a long one shows its two first links and the cause."""
    if len(chain) < 2:
        return ""
    if len(chain) > 4:
        chain = (*chain[:2], f"... {len(chain) - 3} more", chain[-1])
    return " [" + " <- ".join(chain) + "]"


def _limited(items: list[str], limit: int | None, indent: str) -> list[str]:
    shown = items if limit is None else items[:limit]
    lines = [indent + item for item in shown]
    if len(items) > len(shown):
        lines.append(f"{indent}... and {len(items) - len(shown)} more (all of them: --all, or --json)")
    return lines


def _joined(items, limit: int | None) -> str:
    items = list(items)
    if not items:
        return "(none)"
    shown = items if limit is None else items[:limit]
    return ", ".join(shown) + (f", ... (+{len(items) - len(shown)})" if len(items) > len(shown) else "")


def _inputs(inputs) -> str:
    return ", ".join(inputs) if inputs else "(none)"


def _value(value: str | None) -> str:
    return "(absent)" if value is None else value
