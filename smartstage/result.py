"""The text summary of an OptimizeResult: per stage what moved, what stayed and why, what crosses."""

from __future__ import annotations

from collections import Counter

MAX_LISTED = 12


def summary_text(result) -> str:
    lines: list[str] = []
    if not result.options.enabled:
        lines.extend(result.notes)
        return "\n".join(lines)
    for p in result.partitions:
        stage = p.stage
        origin = (f", inserted by auto-stage at {', '.join(repr(n) for n in stage.stage_def.source_nodes)}"
                  if stage.origin == "auto" and stage.stage_def is not None else "")
        lines.append(f"stage {stage.name!r} ({stage.kind}, put {stage.put!r}, take {stage.take!r}{origin})")
        if p.skipped:
            lines.append(f"  unchanged: {p.skipped}")
        else:
            lines.append(f"  moved to the prefetch side ({len(p.moved)}): {_listed(p.moved)}")
        kinds = Counter(pin.kind for pin in p.pinned.values())
        lines.append(f"  pinned on the main side ({len(p.pinned)}): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        for name, pin in list(p.pinned.items())[:MAX_LISTED]:
            lines.append(f"    {name}: {pin.describe()}")
        if len(p.pinned) > MAX_LISTED:
            lines.append(f"    ... and {len(p.pinned) - MAX_LISTED} more")
        lines.append(f"  boundary before ({len(p.boundary_before)}): {_listed(p.boundary_before)}")
        if not p.skipped:
            lines.append(f"  boundary after  ({len(p.boundary_after)}): {_listed(p.boundary_after)}")
        if p.control_reroutes:
            lines.append("  control edges re-routed through put/take: "
                         + ", ".join(f"{a} -> {b}" for a, b in p.control_reroutes[:MAX_LISTED]))
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append("passes: " + "; ".join(f"{r.name} ({'changed' if r.changed else 'no change'}, "
                                         f"{r.seconds * 1000:.1f} ms)" for r in result.reports))
    return "\n".join(lines)


def _listed(names) -> str:
    names = list(names)
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f", ... (+{len(names) - MAX_LISTED})" if len(names) > MAX_LISTED else "")
