"""The JSON form of a GraphDiff: stable, versioned, documented in docs/graph-diff-json.md.

    json_report(diff)  ->  '{\n  "schema": "smartstage.graph_diff",\n  "schema_version": 1, ...'
"""

from __future__ import annotations

import json

from smartstage.inspection.diff import GraphDiff


def json_report(diff: GraphDiff, indent: int | None = 2) -> str:
    """`diff.to_dict()` as JSON text, keys in a fixed order, ending with a newline."""
    return json.dumps(diff.to_dict(), indent=indent, ensure_ascii=False) + "\n"


def read_json_report(text: str) -> GraphDiff:
    """Reads what json_report wrote (GraphError when it is another document or version)."""
    return GraphDiff.from_dict(json.loads(text))
