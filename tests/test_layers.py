"""The package's layers: every import (function-level and TYPE_CHECKING ones included) points down or within
its own layer, no modules import each other in a circle, and no module imports another's private name.

    errors, protos                      L0  the vocabulary every layer shares
    config, graph                       L1  flags; the graph model (view, names, op types, stages)
    passes | runtime                    L2  the rewrite | the staging runtime: siblings, never each other
    optimizer, result                   L3  optimize(): load, run the passes, the result
    inspection | session                L4  views of a result | the result inside a training session
    cli, compat, smartstage/__init__    L5  the command and the facades
    examples                            --  model builders for the demo, tests and benchmarks (leaf)

Inside smartstage.tf2, three rooms in order: step (one tf.function step split in two) < strategy (where a Keras
model's variables live, replicas) < keras (fit and its routes); a room imports only the rooms before it, and
the package's face (smartstage/tf2/__init__.py) loads its public names from the rooms.

Inside the runtime, one door: smartstage.runtime.lanes (the ordered lanes, their producers, tuning and pools) is
imported by its own modules and by smartstage.runtime.door only, so a session whose stages all folded never
loads it (tests/runtime/test_lanes_door.py runs one).
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
# The lanes room and its one door: no other module of the package imports the room.
LANES_ROOM, LANES_DOOR = "smartstage.runtime.lanes", "smartstage.runtime.door"
# smartstage.tf2's rooms, lowest first: a room imports itself and the rooms before it only.
TF2_ROOMS = ("smartstage.tf2.step", "smartstage.tf2.strategy", "smartstage.tf2.keras")
# The one upward import allowed: OptimizeResult.diff() was public API before the layers existed.
ALLOWED_UPWARD = {("smartstage.result", "smartstage.inspection.diff")}


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    modules = {}
    for path in package.rglob("*.py"):
        if path.name.endswith("_pb2.py"):
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _smartstage_imports(module: str, path: Path):
    """(node, origin) for every `from <origin> import ...` of the package in `module` (relative ones resolved),
    at any depth of the file: function-level and `if TYPE_CHECKING:` imports included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level > 0:  # from . import x; from ..graph import y
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            yield node, f"{base}.{node.module}" if node.module else base
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smartstage"):
            yield node, node.module
        elif isinstance(node, ast.Import):
            yield node, None


def import_graph(package: Path = PACKAGE) -> nx.DiGraph:
    """Module -> module it imports (at any depth in the file: lazy imports count, and so do imports under
    `if TYPE_CHECKING:`: a type named in an annotation is a dependency of the design, even if it never runs)."""
    modules = _modules(package)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for node, origin in _smartstage_imports(module, path):
            if isinstance(node, ast.ImportFrom):
                targets = [_resolve(f"{origin}.{a.name}", modules) for a in node.names]
            else:
                targets = [_resolve(a.name, modules) for a in node.names if a.name.startswith("smartstage")]
            for target in targets:
                if target and target != module:
                    graph.add_edge(module, target)
    return graph


def private_imports(package: Path = PACKAGE) -> list[str]:
    """`module: from origin import _name` for every private name (one leading underscore) a module imports
    from another module of the package: what was private to one file has become another's API, so it loses
    the underscore."""
    found = []
    for module, path in _modules(package).items():
        for node, origin in _smartstage_imports(module, path):
            if not isinstance(node, ast.ImportFrom):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                found.append(f"{module}: from {origin} import {', '.join(private)}")
    return found


def _circles(graph: nx.DiGraph) -> list[list[str]]:
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def layer_of(module: str) -> tuple[str, int]:
    unit = max((u for u in LAYER if module == u or module.startswith(u + ".")), key=len)
    return unit, LAYER[unit]


def test_no_import_cycle():
    # TYPE_CHECKING imports count: two modules that name each other's types depend on each other (reach the
    # other through a Protocol in a module below both, as runtime/lanes/producers/host.py does).
    cycles = _circles(import_graph())
    assert not cycles, f"modules that import each other in a circle: {cycles}"


def test_no_private_name_imported_from_another_module():
    found = private_imports()
    assert not found, "private names imported across modules (drop the underscore, or keep it in its module): " + \
        "; ".join(found)


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


def _in(module: str, unit: str) -> bool:
    return module == unit or module.startswith(unit + ".")


def door_breaches(graph: nx.DiGraph) -> list[str]:
    """`source -> target` for every import of the lanes room by a module outside it other than the door."""
    return sorted(f"{source} -> {target}" for source, target in graph.edges
                  if _in(target, LANES_ROOM) and not _in(source, LANES_ROOM) and source != LANES_DOOR)


def test_only_the_door_imports_the_lanes_room():
    breaches = door_breaches(import_graph())
    assert not breaches, ("imports of the lanes room outside its door (go through smartstage.runtime.door, "
                          "which imports it only when a stage runs on lanes): " + ", ".join(breaches))
    # the door does import it (lazily): the rule is about a real edge, not an empty room
    assert any(_in(target, LANES_ROOM) for target in import_graph().successors(LANES_DOOR))


def test_the_door_check_finds_a_module_that_walks_around_the_door(tmp_path):
    package = _package(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/lanes/__init__.py": "",
        "runtime/lanes/producers.py": "X = 1\n",
        "runtime/door.py": "def start():\n    from smartstage.runtime.lanes.producers import X\n",
        "runtime/hooks.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from smartstage.runtime.lanes.producers import X\n",
        "session.py": "from smartstage.runtime.door import start\n",
    })
    assert door_breaches(import_graph(package)) == ["smartstage.runtime.hooks -> smartstage.runtime.lanes.producers"]


def tf2_room_breaches(graph: nx.DiGraph) -> list[str]:
    """`source -> target` for every import from one of smartstage.tf2's rooms into a later room, and every module
    of smartstage.tf2 that stands in no room (the package's face excepted)."""
    def room(module: str) -> int | None:
        return next((k for k, unit in enumerate(TF2_ROOMS) if _in(module, unit)), None)

    found = [f"{module} (in no room of {', '.join(TF2_ROOMS)})" for module in graph.nodes
             if _in(module, "smartstage.tf2") and module != "smartstage.tf2" and room(module) is None]
    for source, target in graph.edges:
        if room(source) is not None and room(target) is not None and room(target) > room(source):
            found.append(f"{source} -> {target}")
    return sorted(found)


def test_the_tf2_rooms_import_only_the_rooms_before_them():
    breaches = tf2_room_breaches(import_graph())
    assert not breaches, "smartstage.tf2 modules out of their room order (step < strategy < keras): " + \
        ", ".join(breaches)


def test_the_tf2_room_check_finds_an_import_into_a_later_room(tmp_path):
    package = _package(tmp_path, {
        "tf2/__init__.py": "",
        "tf2/step/__init__.py": "",
        "tf2/step/split.py": "def split():\n    from smartstage.tf2.keras.fit import fit\n",
        "tf2/keras/__init__.py": "",
        "tf2/keras/fit.py": "from smartstage.tf2.step.split import split\nfit = 1\n",
        "tf2/loose.py": "",
    })
    assert tf2_room_breaches(import_graph(package)) == [
        "smartstage.tf2.loose (in no room of smartstage.tf2.step, smartstage.tf2.strategy, smartstage.tf2.keras)",
        "smartstage.tf2.step.split -> smartstage.tf2.keras.fit"]


@pytest.mark.parametrize("graph_edges, expected", [
    ([("a", "b"), ("b", "a")], [["a", "b"]]),
    ([("a", "b"), ("b", "c")], []),
])
def test_the_cycle_check_finds_a_circle(graph_edges, expected):
    # The check itself can fail: a circle of two modules is found, a chain is not.
    graph = nx.DiGraph(graph_edges)
    assert _circles(graph) == expected


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "smartstage"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_the_cycle_check_sees_a_circle_through_type_checking(tmp_path):
    # ordered.py and stage_threads.py once formed such a circle: one import ran, the other only under TYPE_CHECKING.
    package = _package(tmp_path, {
        "a.py": "from smartstage.b import B\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from smartstage.a import A\nB = 1\n",
        "c.py": "from smartstage.b import B\n",
    })
    assert _circles(import_graph(package)) == [["smartstage.a", "smartstage.b"]]


def test_the_private_name_check_finds_one(tmp_path):
    package = _package(tmp_path, {
        "common.py": "_helper = 1\nhelper = 2\n__version__ = '1'\n",
        "main.py": "from smartstage.common import _helper, helper, __version__\n",
        "cli/__init__.py": "",
        "cli/run.py": "def run():\n    from ..common import _helper\n    from .. import common\n",
    })
    assert sorted(private_imports(package)) == ["smartstage.cli.run: from smartstage.common import _helper",
                                                "smartstage.main: from smartstage.common import _helper"]


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
