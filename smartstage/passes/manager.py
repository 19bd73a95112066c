"""Pass protocol, PassResult, and the Pipeline that runs passes in order and verifies after each.

    pipeline = Pipeline([FindStages(), Partition(), ExpandStage()])
    graph_def, reports = pipeline.run(graph_def, ctx)
    # reports: [PassReport(name="find_stages", changed=False, seconds=0.01, summary=["1 stage: ..."]), ...]

A pass gets the current GraphDef and the shared PassContext, and returns a PassResult: the (new) graph,
whether it changed the graph (computed, never assumed), and summary lines saying what and why. A failing
pass is reported with its name and the passes that ran before it.

The contract is declared, and checked when the Pipeline is built: each pass names the PassContext
fields it `requires` (set before it runs) and the ones it `provides` (sets for later passes), so
`Pipeline([Partition(), FindStages()])` fails at once ("partition requires stages, which no earlier
pass provides") instead of running on an empty analysis.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tensorflow.core.framework import graph_pb2

from smartstage.config.options import SmartStageOptions
from smartstage.errors import PassError, SmartStageError
from smartstage.protos import StageDef
from smartstage.passes.verify import verify_graph

logger = logging.getLogger(__name__)


# The PassContext fields that hold what optimize() knows before any pass runs.
GIVEN = frozenset({"options", "targets", "target_ports", "feeds", "stage_defs"})


@dataclass
class PassContext:
    """What passes share: options, targets and feeds, stage descriptions, and the analyses so far.
    Every field is typed; a pass declares which ones it requires and provides (see Pipeline)."""

    options: SmartStageOptions
    targets: set[str] = field(default_factory=set)
    # target node -> the output ports fetched ("x:1" fetches port 1 only); None: every port of a target
    target_ports: dict[str, set[int]] | None = None
    feeds: set[str] = field(default_factory=set)
    stage_defs: list[StageDef] = field(default_factory=list)
    stages: list = field(default_factory=list)  # [StageBoundary], provided by find_stages (and auto_stage)
    partitions: list = field(default_factory=list)  # [StagePartition], provided by partition
    auto_stage: Any = None  # AutoStageReport, provided by auto_stage
    gpu_placement: dict = field(default_factory=dict)  # stage -> StagePlacement, provided by gpu_placement
    multi_stream: dict = field(default_factory=dict)  # stage -> StreamReport, provided by multi_stream
    notes: list[str] = field(default_factory=list)
    _views: dict[int, Any] = field(default_factory=dict, repr=False)

    def view_of(self, graph_def: graph_pb2.GraphDef):
        """The GraphView of `graph_def`, built once per graph object (passes return new objects when they edit)."""
        from smartstage.graph.view import GraphView

        key = id(graph_def)
        cached = self._views.get(key)
        if cached is None or cached.graph_def is not graph_def:
            cached = self._views[key] = GraphView(graph_def)
        return cached

    def remember(self, view) -> None:
        """Keeps a view already built for `view.graph_def` (the verifier's), so no pass builds it again."""
        self._views[id(view.graph_def)] = view


@dataclass(frozen=True)
class PassResult:
    """What a pass did. A pass that edits a few nodes of a large graph names them in `edited` (with
    `base_view`, the view of its input graph): verification then re-checks only what they can break.
    Without `edited`, the whole graph is verified."""

    graph_def: graph_pb2.GraphDef
    changed: bool
    summary: tuple[str, ...] = ()
    details: Any = None
    edited: frozenset | None = None
    base_view: Any = None


@dataclass(frozen=True)
class PassReport:
    name: str
    changed: bool
    seconds: float
    summary: tuple[str, ...]
    details: Any = None


class Pass(Protocol):
    name: str
    requires: tuple[str, ...]  # PassContext fields this pass reads that some earlier pass must provide
    provides: tuple[str, ...]  # PassContext fields this pass sets

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult: ...


class Pipeline:
    """Runs passes in the declared order; verifies the graph after every pass that changed it."""

    def __init__(self, passes: list[Pass], verify: bool = True):
        self.passes = list(passes)
        self.verify = verify
        _check_order(self.passes)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> tuple[graph_pb2.GraphDef, list[PassReport]]:
        reports: list[PassReport] = []
        for p in self.passes:
            before = tuple(r.name for r in reports)
            start = time.perf_counter()
            try:
                result = p.run(graph_def, ctx)
                if self.verify and result.changed:
                    view = verify_graph(result.graph_def, ctx.stages, base=result.base_view, edited=result.edited)
                    ctx.remember(view)
            except PassError:
                raise
            except SmartStageError as e:
                where = f"pass {p.name!r}" + (f" (after {', '.join(before)})" if before else " (the first pass)")
                wrapped = type(e)(f"{e} [in {where}]")
                wrapped.pass_name, wrapped.passes_before = p.name, before  # type: ignore[attr-defined]
                raise wrapped from e
            except Exception as e:  # a bug in a pass: name it, keep the cause
                raise PassError(f"pass {p.name!r} failed after [{', '.join(before)}]: {type(e).__name__}: {e}",
                                p.name, before) from e
            seconds = time.perf_counter() - start
            logger.debug("pass %s: changed=%s in %.3fs", p.name, result.changed, seconds)
            reports.append(PassReport(p.name, result.changed, seconds, result.summary, result.details))
            graph_def = result.graph_def
        return graph_def, reports


def _check_order(passes: list[Pass]) -> None:
    """Every field a pass requires is given to optimize() or provided by a pass before it."""
    known = set(GIVEN)
    for i, p in enumerate(passes):
        missing = [f for f in getattr(p, "requires", ()) if f not in known]
        if missing:
            before = [q.name for q in passes[:i]]
            raise PassError(f"pass {p.name!r} requires {', '.join(missing)}, which no earlier pass provides "
                            f"(passes before it: {before or 'none'}); put a pass that provides it first",
                            p.name, tuple(before))
        known.update(getattr(p, "provides", ()))
