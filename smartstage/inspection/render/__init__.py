"""Renderers: pictures of a GraphDiff (never of raw graphs).

    text_report(diff)          # plain text, what `smartstage diff` prints
    json_report(diff)          # the stable JSON form (docs/graph-diff-json.md)
    dot_source(diff)           # Graphviz source: prefetch-side and main-side clusters
    svg_drawing(diff)          # the same drawing as SVG, laid out in pure Python (or by Graphviz `dot`)
    html_report(diff, result)  # one self-contained HTML file
    write_tensorboard(before, after, logdir)  # two runs for TensorBoard's graph dashboard
"""

from smartstage.inspection.render.dot import dot_source
from smartstage.inspection.render.html import html_report
from smartstage.inspection.render.json_report import json_report
from smartstage.inspection.render.svg import svg_drawing
from smartstage.inspection.render.tensorboard import write_tensorboard
from smartstage.inspection.render.text import text_report

__all__ = ["dot_source", "html_report", "json_report", "svg_drawing", "text_report", "write_tensorboard"]
