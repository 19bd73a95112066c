"""The drawing of a GraphDiff as SVG, laid out in pure Python (no Graphviz needed).

    svg_drawing(diff)                      # built-in layered layout: deterministic, fast on any size
    svg_drawing(diff, layout="graphviz")   # Graphviz `dot` (apt: graphviz) lays out the DOT source

Built-in layout, top to bottom, so a page scrolls down it: each stage's prefetch cluster (side by side),
then the main cluster below. Inside a cluster, boxes sit in rows by longest path along their edges (edges
against the graph's topological order are ignored for this, which breaks the cycles that collapsing
scopes can create); the put is the last row of its prefetch cluster and the take the first of the main
one, so the boundary edge between them is short and carries the boundary tensors as its label. Within a
row, boxes are ordered by the barycenter of their neighbours, a few sweeps each way; a row wider than
MAX_ROW_WIDTH wraps. Every box is a <g> with the box's id, so the HTML report's search can light it up
whichever layout drew it.
"""

from __future__ import annotations

from collections import defaultdict
from xml.sax.saxutils import escape, quoteattr

from smartstage.inspection.diff import GraphDiff
from smartstage.inspection.render.dot import dot_source, dot_to_svg, graphviz_available
from smartstage.inspection.render.drawing import DEFAULT_MAX_BOXES, Box, Drawing, build_drawing

CHAR_WIDTH = 6.6
BOX_HEIGHT = 36
ROW_GAP = 34
BOX_GAP = 14
MAX_ROW_WIDTH = 1150  # a wider row of boxes wraps onto the next line
CLUSTER_PAD = 16
CLUSTER_HEADER = 26
CLUSTER_GAP = 28
BOUNDARY_GAP = 120  # between the prefetch clusters and the main one: room for the boundary label
MAX_LABEL_CHARS = 44
SWEEPS = 4
LAYOUTS = ("builtin", "graphviz", "auto")

STYLE = """
.ss-drawing text { font-family: Helvetica, Arial, sans-serif; }
.ss-drawing .cluster rect { stroke: #b0bec5; rx: 10; }
.ss-drawing .cluster.prefetch rect { fill: #e3f2fd; }
.ss-drawing .cluster.main rect { fill: #f1f8e9; }
.ss-drawing .cluster text { font-size: 13px; font-weight: bold; fill: #37474f; }
.ss-drawing .box rect { fill: #ffffff; stroke: #90a4ae; stroke-width: 1; rx: 5; }
.ss-drawing .box.scope rect { stroke-width: 2; stroke-dasharray: 5 2; }
.ss-drawing .box.moved rect { fill: #ffb74d; stroke: #e65100; stroke-width: 2; }
.ss-drawing .box.pinned rect { fill: #fdecea; stroke: #c62828; }
.ss-drawing .box.put rect, .ss-drawing .box.take rect { fill: #90caf9; stroke: #1565c0; stroke-width: 2; }
.ss-drawing .box.hit rect { stroke: #d500f9; stroke-width: 4; }
.ss-drawing .box text { font-size: 11px; fill: #212121; }
.ss-drawing .box text.sub { font-size: 9px; fill: #546e7a; }
.ss-drawing .edge path { fill: none; stroke: #90a4ae; stroke-width: 1.2; }
.ss-drawing .edge.control path { stroke-dasharray: 4 3; }
.ss-drawing .edge.boundary path { stroke: #1e88e5; stroke-width: 3; }
.ss-drawing .edge text { font-size: 9px; fill: #0d47a1; }
"""


def svg_drawing(diff: GraphDiff, max_boxes: int = DEFAULT_MAX_BOXES, layout: str = "builtin",
                drawing: Drawing | None = None) -> str:
    """SVG text of the drawing of `diff`. layout: builtin | graphviz | auto (graphviz when installed)."""
    if layout not in LAYOUTS:
        from smartstage.errors import ConfigError

        raise ConfigError(f"unknown layout {layout!r}; use one of {LAYOUTS}")
    drawing = drawing or build_drawing(diff, max_boxes)
    if layout == "graphviz" or (layout == "auto" and graphviz_available()):
        return dot_to_svg(dot_source(diff, drawing=drawing))
    return layout_svg(drawing)


def _short(text: str, limit: int = MAX_LABEL_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return text[:half] + "…" + text[-(limit - 1 - half):]


def _width(box: Box) -> float:
    return max(len(_short(box.label)) * CHAR_WIDTH, len(box.subtitle) * CHAR_WIDTH * 0.85, 48) + 16


def _rows(drawing: Drawing, cluster_id: str) -> list[list[Box]]:
    boxes = [b for b in drawing.boxes if b.cluster == cluster_id]
    if not boxes:
        return []
    ids = {b.id for b in boxes}
    rank = {b.id: (b.order, b.id) for b in boxes}
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for e in drawing.edges:
        if e.src in ids and e.dst in ids:
            preds[e.dst].append(e.src)
            succs[e.src].append(e.dst)
    layer = {b.id: 0 for b in boxes}
    for b in sorted(boxes, key=lambda b: rank[b.id]):
        for p in preds[b.id]:
            if rank[p] < rank[b.id] and drawing.box(p).role != "put":
                layer[b.id] = max(layer[b.id], layer[p] + 1)
    if any(b.role == "take" for b in boxes):  # the take alone on top, the rest of the main side below it
        for b in boxes:
            layer[b.id] = 0 if b.role == "take" else layer[b.id] + 1
    puts = [b for b in boxes if b.role == "put"]
    if puts:  # the put alone at the bottom of its prefetch side
        last = max((layer[b.id] for b in boxes if b.role != "put"), default=-1) + 1
        for b in puts:
            layer[b.id] = last
    rows: list[list[Box]] = [[] for _ in range(max(layer.values()) + 1)]
    for b in sorted(boxes, key=lambda b: rank[b.id]):
        rows[layer[b.id]].append(b)
    rows = [r for r in rows if r]

    # Barycenter sweeps: order each row by the mean position of its neighbours in the adjacent rows.
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        sequence = range(1, len(rows)) if down else range(len(rows) - 2, -1, -1)
        for i in sequence:
            ref = rows[i - 1] if down else rows[i + 1]
            spot = {b.id: k / max(len(ref) - 1, 1) for k, b in enumerate(ref)}
            neighbours = preds if down else succs
            own = rows[i]

            def key(k: int, b: Box) -> tuple:
                near = [spot[n] for n in neighbours[b.id] if n in spot]
                return (sum(near) / len(near) if near else k / max(len(own) - 1, 1), k)

            rows[i] = [b for _, b in sorted(((key(k, b), b) for k, b in enumerate(own)), key=lambda kb: kb[0])]
    return rows


def _wrapped(rows: list[list[Box]]) -> list[list[Box]]:
    out = []
    for row in rows:
        line: list[Box] = []
        width = 0.0
        for b in row:
            if line and width + _width(b) > MAX_ROW_WIDTH:
                out.append(line)
                line, width = [], 0.0
            line.append(b)
            width += _width(b) + BOX_GAP
        out.append(line)
    return out


def layout_svg(drawing: Drawing) -> str:
    """The built-in layout of a Drawing, as standalone SVG text."""
    position: dict[str, tuple[float, float, float]] = {}  # id -> (x, y, width)
    frames: list[tuple[str, str, float, float, float, float]] = []  # (class, label, x, y, w, h)

    def measure(cluster) -> tuple[list[list[Box]], float, float]:
        lines = _wrapped(_rows(drawing, cluster.id))
        inner = max((sum(_width(b) for b in line) + BOX_GAP * (len(line) - 1) for line in lines), default=0.0)
        w = max(inner + 2 * CLUSTER_PAD, len(cluster.label) * 7.5 + 2 * CLUSTER_PAD)
        h = CLUSTER_HEADER + 2 * CLUSTER_PAD + len(lines) * (BOX_HEIGHT + ROW_GAP) - (ROW_GAP if lines else 0)
        return lines, w, h

    def place(cluster, lines, x0: float, y0: float, w: float, h: float) -> None:
        y = y0 + CLUSTER_HEADER + CLUSTER_PAD
        for line in lines:
            line_width = sum(_width(b) for b in line) + BOX_GAP * (len(line) - 1)
            x = x0 + (w - line_width) / 2
            for b in line:
                position[b.id] = (x, y, _width(b))
                x += _width(b) + BOX_GAP
            y += BOX_HEIGHT + ROW_GAP
        frames.append(("main" if cluster.side == "main" else "prefetch", cluster.label, x0, y0, w, h))

    margin = 12.0
    measured = [(c, *measure(c)) for c in drawing.clusters]
    top = [m for m in measured if m[0].side != "main"]
    main = next(m for m in measured if m[0].side == "main")
    top_width = sum(m[2] for m in top) + CLUSTER_GAP * max(len(top) - 1, 0)
    total_inner = max(top_width, main[2])
    x = margin + (total_inner - top_width) / 2
    top_height = max((m[3] for m in top), default=0.0)
    for cluster, lines, w, h in top:
        place(cluster, lines, x, margin, w, h)
        x += w + CLUSTER_GAP
    main_y = margin + (top_height + BOUNDARY_GAP if top else 0.0)
    place(main[0], main[1], margin + (total_inner - main[2]) / 2, main_y, main[2], main[3])
    total_w = total_inner + 2 * margin
    total_h = main_y + main[3] + margin

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="ss-drawing" width="{total_w:.0f}" '
           f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}">',
           "<defs><marker id=\"ss-arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" "
           "markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#78909c\"/>"
           "</marker></defs>",
           f"<style>{STYLE}</style>"]
    for kind, label, x0, y0, w, h in frames:
        out.append(f'<g class="cluster {kind}"><rect x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}"/>'
                   f'<text x="{x0 + CLUSTER_PAD:.1f}" y="{y0 + 18:.1f}">{escape(label)}</text></g>')
    for e in drawing.edges:
        if e.src not in position or e.dst not in position:
            continue
        x1, y1, w1 = position[e.src]
        x2, y2, w2 = position[e.dst]
        sx, sy, tx, ty = x1 + w1 / 2, y1 + BOX_HEIGHT, x2 + w2 / 2, y2
        dy = max(16.0, (ty - sy) / 2) if ty > sy else 60.0 + (sy - ty) / 8
        classes = "edge" + (" boundary" if e.boundary else "") + (" control" if e.control else "")
        width = "" if e.boundary or e.count <= 1 else f' style="stroke-width:{min(1.2 + e.count / 10, 4):.1f}"'
        path = f"M {sx:.1f} {sy:.1f} C {sx:.1f} {sy + dy:.1f}, {tx:.1f} {ty - dy:.1f}, {tx:.1f} {ty:.1f}"
        title = f"{drawing.box(e.src).label} -> {drawing.box(e.dst).label}" + (f" ({e.count} edges)" if e.count > 1 else "")
        out.append(f'<g class="{classes}"><title>{escape(title)}</title>'
                   f'<path d="{path}" marker-end="url(#ss-arrow)"{width}/>')
        if e.label and e.boundary:
            head, _, rest = e.label.partition(": ")
            parts = [head + ":"] + (rest.split(", ") if rest else [])
            lx, ly = max(sx, tx) + 12, (sy + ty) / 2 - 6 * (len(parts) - 1)
            for k, part in enumerate(parts):
                out.append(f'<text x="{lx:.1f}" y="{ly + 12 * k:.1f}">{escape(_short(part, 60))}</text>')
        out.append("</g>")
    for b in drawing.boxes:
        if b.id not in position:
            continue
        x0, y0, w = position[b.id]
        classes = " ".join(["box", b.role] + (["moved"] if b.moved else []) + (["pinned"] if b.pinned and not b.moved else []))
        title = b.label + (f"\n{b.subtitle}" if b.subtitle else "")
        out.append(f'<g class="{classes}" id={quoteattr(b.id)}><title>{escape(title)}</title>'
                   f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{BOX_HEIGHT}"/>'
                   f'<text x="{x0 + 8:.1f}" y="{y0 + 15:.1f}">{escape(_short(b.label))}</text>'
                   f'<text class="sub" x="{x0 + 8:.1f}" y="{y0 + 29:.1f}">{escape(b.subtitle)}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
