"""Graphviz source of a GraphDiff's drawing: prefetch-side and main-side clusters, moved nodes highlighted.

    dot_source(diff)  ->  digraph smartstage { rankdir=LR; subgraph cluster_prefetch_0 { ... } ... }
    dot_to_svg(source)  # runs the `dot` binary (apt: graphviz); GraphvizMissing when it is not installed

The boundary tensors label the edges into each put and the put -> take edge between the clusters.
Large graphs are collapsed by name scope (see smartstage.inspection.render.drawing).
"""

from __future__ import annotations

import shutil
import subprocess

from smartstage.inspection.diff import GraphDiff
from smartstage.errors import SmartStageError
from smartstage.inspection.render.drawing import DEFAULT_MAX_BOXES, Box, Drawing, build_drawing

MOVED_FILL = "#ffb74d"
PINNED_FILL = "#fdecea"
STAGE_FILL = "#90caf9"
PREFETCH_BG = "#e3f2fd"
MAIN_BG = "#f1f8e9"
DOT_TIMEOUT_SECONDS = 120


class GraphvizMissing(SmartStageError):
    """The Graphviz `dot` binary is not installed (apt-get install graphviz), or it failed."""


def dot_source(diff: GraphDiff, max_boxes: int = DEFAULT_MAX_BOXES, drawing: Drawing | None = None) -> str:
    """The DOT text of the drawing of `diff` (deterministic: same diff, same text)."""
    drawing = drawing or build_drawing(diff, max_boxes)
    lines = [
        "digraph smartstage {",
        '  graph [rankdir=LR, fontname="Helvetica", fontsize=12, nodesep=0.25, ranksep=0.6];',
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="Helvetica", fontsize=10];',
        '  edge [color="#78909c", fontname="Helvetica", fontsize=9];',
    ]
    for cluster in drawing.clusters:
        bg = MAIN_BG if cluster.side == "main" else PREFETCH_BG
        lines.append(f"  subgraph {cluster.id} {{")
        lines.append(f'    graph [label={_q(cluster.label)}, style="rounded,filled", fillcolor="{bg}", color="#b0bec5"];')
        for box in drawing.boxes:
            if box.cluster == cluster.id:
                lines.append(f"    {box.id} [{_box_attrs(box)}];")
        lines.append("  }")
    for e in drawing.edges:
        attrs = []
        if e.label:
            attrs.append(f"label={_q(e.label)}")
        if e.boundary:
            attrs.append('penwidth=3, color="#1e88e5", fontcolor="#0d47a1", class="boundary"')
        elif e.control:
            attrs.append("style=dashed")
        if e.count > 1 and not e.boundary:
            attrs.append(f"penwidth={min(1 + e.count / 10, 4):.1f}")
        lines.append(f"  {e.src} -> {e.dst}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _box_attrs(box: Box) -> str:
    label = box.label + "\n" + box.subtitle if box.subtitle else box.label
    attrs = [f"label={_q(label)}", f"id={_q(box.id)}", f"tooltip={_q(box.label)}"]
    classes = ["box", box.role]
    if box.role in ("put", "take"):
        attrs.append(f'fillcolor="{STAGE_FILL}", penwidth=2')
    elif box.moved:
        attrs.append(f'fillcolor="{MOVED_FILL}", penwidth=2')
        classes.append("moved")
    elif box.pinned:
        attrs.append(f'fillcolor="{PINNED_FILL}", color="#c62828"')
        classes.append("pinned")
    if box.role == "scope":
        attrs.append('shape=box3d, style="filled"')
    attrs.append(f"class={_q(' '.join(classes))}")
    return ", ".join(attrs)


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graphviz_available() -> bool:
    return shutil.which("dot") is not None


def dot_to_svg(source: str) -> str:
    """Lays out DOT text with the `dot` binary; GraphvizMissing when it is not installed or fails."""
    binary = shutil.which("dot")
    if binary is None:
        raise GraphvizMissing("the Graphviz 'dot' binary is not installed (apt-get install graphviz); "
                              "use the built-in layout instead (layout='builtin')")
    try:
        done = subprocess.run([binary, "-Tsvg"], input=source.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise GraphvizMissing(f"Graphviz 'dot' took over {DOT_TIMEOUT_SECONDS}s; use layout='builtin'") from None
    if done.returncode != 0:
        raise GraphvizMissing(f"Graphviz 'dot' failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    svg = done.stdout.decode()
    return svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inlined into HTML
