"""The HTML report: one self-contained file (no network, no external files) about a GraphDiff.

    html_report(diff, result)  ->  "<!DOCTYPE html><html>... summary table, drawing (inline SVG),
                                    per stage: moved and pinned lists with reasons, other changes ..."

A search box filters every list and lights up the boxes of the drawing whose node names (or name scope)
match; `report.html#search=hash` opens the page with a search applied. When the page has laid out the
drawing, the script sets `data-drawing-boxes` and `data-drawing-width` on <body> (a headless browser test
reads them back).
"""

from __future__ import annotations

import json
from html import escape

from smartstage.graph.stages import INPUTS
from smartstage.inspection.diff import GraphDiff, StageDiff
from smartstage.inspection.render.drawing import DEFAULT_MAX_BOXES, build_drawing
from smartstage.inspection.render.svg import svg_drawing

DEFAULT_MAX_ITEMS = 2000  # entries per list; the JSON report has them all

CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 0; color: #212121; background: #fafafa; }
header { background: #263238; color: #fff; padding: 14px 24px; position: sticky; top: 0; z-index: 2;
         display: flex; gap: 24px; align-items: center; flex-wrap: wrap; }
header h1 { font-size: 20px; margin: 0; }
header input { font-size: 15px; padding: 6px 10px; width: 340px; border-radius: 4px; border: none; }
header .count { font-size: 13px; color: #cfd8dc; }
main { padding: 8px 24px 40px; }
h2 { font-size: 18px; border-bottom: 2px solid #cfd8dc; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #cfd8dc; padding: 4px 10px; text-align: left; font-size: 13px; vertical-align: top; }
th { background: #eceff1; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
ul.nodes { list-style: none; padding-left: 0; margin: 0; font-size: 13px; }
ul.nodes li { padding: 2px 6px; border-bottom: 1px solid #eceff1; background: #fff; }
ul.nodes li code { font-weight: bold; }
.op { color: #607d8b; }
.reason { color: #b71c1c; }
.chain { color: #546e7a; font-size: 12px; }
.moved-tag { background: #ffb74d; border-radius: 3px; padding: 0 4px; }
.drawing { overflow: auto; border: 1px solid #cfd8dc; background: #fff; max-height: 80vh; }
.legend span { display: inline-block; padding: 2px 8px; margin-right: 8px; border-radius: 4px; font-size: 12px; }
.more { color: #757575; font-style: italic; }
details summary { cursor: pointer; font-weight: bold; margin: 8px 0; }
g.hit polygon, g.hit path, g.hit ellipse { stroke: #d500f9 !important; stroke-width: 4 !important; }
.ok { color: #2e7d32; } .skipped { color: #ef6c00; }
"""

SCRIPT = """
(function () {
  const boxes = JSON.parse(document.getElementById('ss-boxes').textContent);
  const input = document.getElementById('ss-search');
  const count = document.getElementById('ss-count');
  const items = Array.from(document.querySelectorAll('[data-name]'));
  function apply() {
    const q = input.value.trim().toLowerCase();
    let shown = 0, hits = 0;
    for (const el of items) {
      const hay = (el.dataset.name + ' ' + (el.dataset.text || '')).toLowerCase();
      const visible = !q || hay.includes(q);
      el.hidden = !visible;
      if (visible) shown++;
    }
    for (const [id, b] of Object.entries(boxes)) {
      const el = document.getElementById(id);
      if (!el) continue;
      const hit = !!q && (b.label.toLowerCase().includes(q) || b.names.some(n => n.toLowerCase().includes(q)));
      el.classList.toggle('hit', hit);
      if (hit) hits++;
    }
    count.textContent = q ? shown + ' matching entries, ' + hits + ' boxes lit in the drawing' : '';
    document.body.dataset.searchHits = String(hits);
  }
  input.addEventListener('input', apply);
  const m = /[#&]search=([^&]*)/.exec(location.hash);
  if (m) { input.value = decodeURIComponent(m[1]); }
  apply();
  const svg = document.querySelector('.drawing svg');
  if (svg) {
    const box = svg.getBBox();
    document.body.dataset.drawingWidth = String(Math.round(box.width));
    document.body.dataset.drawingBoxes = String(svg.querySelectorAll('g.box, g.node').length);
  }
})();
"""


def html_report(diff: GraphDiff, result=None, *, title: str = "SmartStage report", layout: str = "builtin",
                max_boxes: int = DEFAULT_MAX_BOXES, max_items: int | None = DEFAULT_MAX_ITEMS) -> str:
    """The whole report as one HTML string. result: the OptimizeResult, for the pass table (optional)."""
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<header><h1>{escape(title)}</h1><input id=\"ss-search\" type=\"search\" "
             "placeholder=\"search nodes, ops, reasons\" aria-label=\"search\"><span id=\"ss-count\" "
             "class=\"count\"></span></header><main>"]
    parts.append(_summary(diff))
    boxes_json = "{}"
    if diff.after_graph is not None:
        drawing = build_drawing(diff, max_boxes)
        boxes_json = json.dumps({b.id: {"label": b.label, "names": list(b.names)} for b in drawing.boxes})
        note = (f"{drawing.drawn_nodes} of {drawing.total_nodes} nodes drawn as {len(drawing.boxes)} boxes"
                + ("; name scopes with many nodes are collapsed into one box each" if drawing.collapsed else "")
                + (f"; {drawing.hidden} stage ops and free nodes (constants) left out" if drawing.hidden else ""))
        parts.append("<h2>Drawing: the rewritten graph</h2>"
                     "<p class=\"legend\"><span style=\"background:#ffb74d\">moved</span>"
                     "<span style=\"background:#fdecea;border:1px solid #c62828\">pinned</span>"
                     "<span style=\"background:#90caf9\">put / take</span>"
                     "<span style=\"border:2px dashed #90a4ae\">collapsed name scope</span>"
                     f"{escape(note)}</p>")
        parts.append(f"<div class=\"drawing\">{svg_drawing(diff, max_boxes, layout=layout, drawing=drawing)}</div>")
    for stage in diff.stages:
        parts.append(_stage_section(diff, stage, max_items))
    if diff.placement:
        parts.append(placement_section(diff.placement))
    parts.append(_other_changes(diff, max_items))
    if result is not None:
        parts.append(_passes(result))
    if diff.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in diff.notes) + "</ul>")
    parts.append(f"</main><script type=\"application/json\" id=\"ss-boxes\">{_script_safe(boxes_json)}</script>"
                 f"<script>{SCRIPT}</script></body></html>\n")
    return "".join(parts)


def _script_safe(text: str) -> str:
    return text.replace("</", "<\\/")


def _summary(diff: GraphDiff) -> str:
    c = diff.counts()
    rows = [("nodes", f"{diff.before_nodes} &rarr; {diff.after_nodes}"), ("moved", c["moved"]),
            ("pinned", c["pinned"] if diff.has_pins else "unknown (no optimizer result)"), ("added", c["added"]),
            ("removed", c["removed"]), ("rewired inputs", c["rewired"]), ("op changes", c["op_changes"]),
            ("device changes", c["device_changes"]), ("attribute changes", c["attr_changes"])]
    out = ["<h2>Summary</h2><table id=\"ss-summary\"><tbody>"]
    out.extend(f"<tr><th>{k}</th><td class=\"num\">{v}</td></tr>" for k, v in rows)
    out.append("</tbody></table>")
    if diff.stages:
        out.append("<h3>Stages</h3><table id=\"ss-stages\"><thead><tr><th>stage</th><th>kind</th><th>put / take</th>"
                   "<th>prefetch-side nodes</th><th>boundary tensors</th><th>moved</th><th>pinned</th><th>status</th>"
                   "</tr></thead><tbody>")
        for s in diff.stages:
            status = (f"<span class=\"skipped\">unchanged: {escape(s.skipped)}</span>" if s.skipped else
                      "<span class=\"ok\">rewritten</span>" if diff.moved_in(s.name) or diff.moved_in(s.name, "main")
                      else "no change")
            ends = "the graph's inputs" if s.kind == INPUTS else f"{escape(s.put)} / {escape(s.take)}"
            out.append(f"<tr><td><a href=\"#stage-{_anchor(s.name)}\">{escape(s.name)}</a></td><td>{escape(s.kind)}</td>"
                       f"<td>{ends}</td>"
                       f"<td class=\"num\">{s.prefetch_nodes_before} &rarr; {s.prefetch_nodes_after}</td>"
                       f"<td class=\"num\">{len(s.boundary_before)} &rarr; {len(s.boundary_after)}</td>"
                       f"<td class=\"num\">{len(diff.moved_in(s.name))}</td>"
                       f"<td class=\"num\">{len(diff.pinned_in(s.name)) if diff.has_pins else '?'}</td>"
                       f"<td>{status}</td></tr>")
        out.append("</tbody></table>")
    else:
        out.append("<p>Neither graph has a stage: nothing can have moved.</p>")
    return "".join(out)


def placement_section(placements) -> str:
    """Scale-out: per stage, what stays on the trainer, what each input task runs, what crosses per batch."""
    out = ["<h2 id=\"placement\">Placement on input tasks</h2>"]
    for p in placements:
        kind = "central source" if p.mode == "central" else "sharded sources"
        out.append(f"<h3>Stage {escape(p.stage)}: {kind} on {len(p.tasks)} task(s) of job {escape(p.job)}</h3>")
        out.append("<table class=\"placement\"><thead><tr><th>where</th><th>runs</th><th>nodes</th>"
                   "<th>main op types</th><th>e.g.</th></tr></thead><tbody>")
        trainer = escape(p.trainer or "trainer (the session's task)")
        out.append(f"<tr data-name=\"{escape(' '.join(p.head + p.stage_ops))}\"><td>{trainer}</td>"
                   f"<td>{'head (once per batch, in order); ' if p.head else ''}buffer, put, take</td>"
                   f"<td class=\"num\">{len(p.head) + len(p.stage_ops)}</td><td></td>"
                   f"<td><code>{escape(', '.join((p.head + p.stage_ops)[:6]))}</code></td></tr>")
        for i, t in enumerate(p.tasks):
            runs = (f"lanes {', '.join(str(k) for k in t.lanes)}" if p.mode == "central"
                    else f"shard {i} of {len(p.tasks)}")
            ops = ", ".join(f"{escape(op)} &times;{n}" for op, n in t.ops)
            out.append(f"<tr data-name=\"{escape(' '.join(t.examples))}\"><td>{escape(t.task)}</td><td>{runs}</td>"
                       f"<td class=\"num\">{t.nodes}</td><td>{ops}</td>"
                       f"<td><code>{escape(', '.join(t.examples))}</code></td></tr>")
        out.append("</tbody></table>")
        for title, tensors in (("trainer &rarr; tasks", p.to_tasks), ("tasks &rarr; trainer", p.from_tasks)):
            total = p.bytes_of(tensors)
            size = "" if not tensors else f", {total} bytes" if total is not None else ", bytes unknown"
            shown = ", ".join(f"<code>{escape(t.name)}</code> {escape(t.dtype)}{escape(t.shape or '[?]')}"
                              for t in tensors) or "nothing"
            out.append(f"<p>Per batch {title}: {len(tensors)} tensor(s){size}: {shown}</p>")
    return "".join(out)


def _anchor(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def _items(rows: list[str], max_items: int | None) -> str:
    shown = rows if max_items is None else rows[:max_items]
    more = len(rows) - len(shown)
    tail = f"<li class=\"more\">... and {more} more (see the JSON report)</li>" if more else ""
    return "<ul class=\"nodes\">" + "".join(shown) + tail + "</ul>"


def _li(name: str, body: str, text: str = "") -> str:
    return f"<li data-name=\"{escape(name)}\" data-text=\"{escape(text)}\">{body}</li>"


def _stage_section(diff: GraphDiff, stage: StageDiff, max_items: int | None) -> str:
    out = [f"<h2 id=\"stage-{_anchor(stage.name)}\">Stage {escape(stage.name)}</h2>"]
    if stage.skipped:
        out.append(f"<p class=\"skipped\">Unchanged: {escape(stage.skipped)}</p>")
    moved = diff.moved_in(stage.name)
    out.append(f"<h3>Moved to the prefetch side ({len(moved)})</h3>")
    out.append(_items([_li(m.name, f"<code>{escape(m.name)}</code> <span class=\"op\">{escape(m.op)}</span>", m.op)
                       for m in moved], max_items))
    back = diff.moved_in(stage.name, "main")
    if back:
        out.append(f"<h3>Moved off the prefetch side ({len(back)})</h3>")
        out.append(_items([_li(m.name, f"<code>{escape(m.name)}</code> <span class=\"op\">{escape(m.op)}</span> "
                                       f"&rarr; {escape(m.side_after)}", m.op) for m in back], max_items))
    if diff.has_pins:
        pinned = diff.pinned_in(stage.name)
        out.append(f"<h3>Pinned on the main side ({len(pinned)})</h3>")
        rows = []
        for p in pinned:
            names = diff.chain(p.name, p.stage)
            chain = " &larr; ".join(escape(n) for n in names) if len(names) > 1 else ""
            body = (f"<code>{escape(p.name)}</code> <span class=\"op\">{escape(p.op)}</span> "
                    f"<span class=\"reason\">{escape(p.reason)}</span>"
                    + (f"<div class=\"chain\">chain: {chain}</div>" if chain else ""))
            rows.append(_li(p.name, body, f"{p.op} {p.kind} {p.reason} {p.cause}"))
        out.append(_items(rows, max_items))
    for title, tensors in (("Boundary tensors before", stage.boundary_before),
                           ("Boundary tensors after", stage.boundary_after)):
        out.append(f"<h3>{title} ({len(tensors)})</h3>")
        out.append(_items([_li(t, f"<code>{escape(t)}</code>") for t in tensors], max_items))
    if stage.control_reroutes:
        out.append(f"<h3>Control edges re-routed through the put and the take ({len(stage.control_reroutes)})</h3>")
        out.append(_items([_li(f"{a} {b}", f"<code>{escape(a)}</code> &rarr; <code>{escape(b)}</code>")
                           for a, b in stage.control_reroutes], max_items))
    return "".join(out)


def _other_changes(diff: GraphDiff, max_items: int | None) -> str:
    sections = [
        ("Added nodes", [_li(n.name, f"<code>{escape(n.name)}</code> <span class=\"op\">{escape(n.op)}</span>", n.op)
                         for n in diff.added]),
        ("Removed nodes", [_li(n.name, f"<code>{escape(n.name)}</code> <span class=\"op\">{escape(n.op)}</span>",
                               n.op) for n in diff.removed]),
        ("Rewired inputs", [_li(r.name, f"<code>{escape(r.name)}</code>: {escape(', '.join(r.before))} &rarr; "
                                        f"{escape(', '.join(r.after))}", " ".join(r.before + r.after))
                            for r in diff.rewired]),
        ("Op changes", [_li(v.name, f"<code>{escape(v.name)}</code>: {escape(v.before)} &rarr; {escape(v.after)}")
                        for v in diff.op_changes]),
        ("Device changes", [_li(v.name, f"<code>{escape(v.name)}</code>: {escape(v.before or '(none)')} &rarr; "
                                        f"{escape(v.after or '(none)')}", f"{v.before} {v.after}")
                            for v in diff.device_changes]),
        ("Attribute changes", [_li(a.name, f"<code>{escape(a.name)}</code>.{escape(a.attr)}: "
                                           f"{escape(str(a.before))} &rarr; {escape(str(a.after))}", a.attr)
                               for a in diff.attr_changes]),
    ]
    out = ["<h2>Other changes</h2>"]
    for title, rows in sections:
        out.append(f"<details{' open' if 0 < len(rows) <= 20 else ''}><summary>{title} ({len(rows)})</summary>"
                   f"{_items(rows, max_items)}</details>")
    return "".join(out)


def _passes(result) -> str:
    out = ["<h2>Passes</h2><table id=\"ss-passes\"><thead><tr><th>pass</th><th>changed</th><th>ms</th>"
           "<th>what it did</th></tr></thead><tbody>"]
    for r in result.reports:
        out.append(f"<tr><td>{escape(r.name)}</td><td>{'yes' if r.changed else 'no'}</td>"
                   f"<td class=\"num\">{r.seconds * 1000:.1f}</td><td>{'<br>'.join(escape(s) for s in r.summary)}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)
