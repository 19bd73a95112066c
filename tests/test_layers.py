"""The package's layers: every import (function-level ones included) points down or within its own layer,
and no modules import each other in a circle.

    errors, protos                      L0  the vocabulary every layer shares
    config, graph                       L1  flags; the graph model (view, names, op types, stages)
    passes | runtime                    L2  the rewrite | the staging runtime: siblings, never each other
    optimizer, result                   L3  optimize(): load, run the passes, the result
    inspection | session                L4  views of a result | the result inside a training session
    cli, compat, smartstage/__init__    L5  the command and the facades
    examples                            --  model builders for the demo, tests and benchmarks (leaf)
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "smartstage"

LAYER = {
    "smartstage.errors": 0, "smartstage.protos": 0,
    "smartstage.config": 1, "smartstage.graph": 1,
    "smartstage.passes": 2, "smartstage.runtime": 2,
    "smartstage.optimizer": 3, "smartstage.result": 3,
    "smartstage.inspection": 4, "smartstage.session": 4, "smartstage.tf2": 4,
    "smartstage.cli": 5, "smartstage.compat": 5, "smartstage": 5,
    "smartstage.examples": 0,
}
SIBLINGS = {frozenset({"smartstage.passes", "smartstage.runtime"}),
            frozenset({"smartstage.inspection", "smartstage.session"})}
# The one upward import allowed: OptimizeResult.diff() was public API before the layers existed.
ALLOWED_UPWARD = {("smartstage.result", "smartstage.inspection.diff")}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith("_pb2.py"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:`: they name types for annotations and never run."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            lines |= {n.lineno for child in node.body for n in ast.walk(child)}
    return lines


def import_graph(runtime_only: bool = False) -> nx.DiGraph:
    """Module -> module it imports (at any depth in the file: lazy imports count). With runtime_only,
    imports under `if TYPE_CHECKING:` are left out: they never execute, so they cannot close a circle."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree) if runtime_only else set()
        for node in ast.walk(tree):
            targets = []
            if getattr(node, "lineno", None) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.level > 0:  # from . import x; from ..graph import y
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                origin = f"{base}.{node.module}" if node.module else base
                targets = [_resolve(f"{origin}.{a.name}", modules) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smartstage"):
                targets = [_resolve(f"{node.module}.{a.name}", modules) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [_resolve(a.name, modules) for a in node.names if a.name.startswith("smartstage")]
            for target in targets:
                if target and target != module:
                    graph.add_edge(module, target)
    return graph


def layer_of(module: str) -> tuple[str, int]:
    unit = max((u for u in LAYER if module == u or module.startswith(u + ".")), key=len)
    return unit, LAYER[unit]


def test_no_import_cycle():
    # Annotations may name each other's types (an import under TYPE_CHECKING); executed imports may not circle.
    graph = import_graph(runtime_only=True)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"modules that import each other in a circle: {cycles}"


def test_every_import_points_down_or_within_its_layer():
    upward = []
    for source, target in import_graph().edges:
        (source_unit, source_layer), (target_unit, target_layer) = layer_of(source), layer_of(target)
        if source_unit == target_unit or (source, target) in ALLOWED_UPWARD:
            continue
        if target_layer > source_layer or frozenset({source_unit, target_unit}) in SIBLINGS:
            upward.append(f"{source} -> {target}")
        if source_unit == "smartstage.examples":
            upward.append(f"{source} -> {target} (examples build models and import no smartstage layer)")
    assert not upward, "imports that point up or sideways: " + ", ".join(sorted(upward))


@pytest.mark.parametrize("graph_edges, expected", [
    ([("a", "b"), ("b", "a")], [["a", "b"]]),
    ([("a", "b"), ("b", "c")], []),
])
def test_the_cycle_check_finds_a_circle(graph_edges, expected):
    # The check itself can fail: a circle of two modules is found, a chain is not.
    graph = nx.DiGraph(graph_edges)
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == expected


def test_the_layer_check_sees_lazy_imports(tmp_path):
    assert layer_of("smartstage.passes.gpu.placement") == ("smartstage.passes", 2)
    assert layer_of("smartstage.optimizer") == ("smartstage.optimizer", 3)
    # the graph includes imports inside functions: live_rewrite imports the optimizer lazily
    assert import_graph().has_edge("smartstage.session.live_rewrite", "smartstage.optimizer")
    # relative imports count too: compat's package imports its sessions module as `from . import sessions`
    assert import_graph().has_edge("smartstage.compat", "smartstage.compat.sessions")


def test_no_module_over_450_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 450}
    assert not long, f"modules over 450 lines (split by responsibility): {long}"
