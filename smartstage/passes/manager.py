"""Pass protocol, PassResult, and the PassManager that runs passes in order and verifies after each.

    manager = PassManager([FindStages(), Partition(), ExpandStage()])
    graph_def, reports = manager.run(graph_def, ctx)
    # reports: [PassReport(name="find_stages", changed=False, seconds=0.01, summary=["1 stage: ..."]), ...]

A pass gets the current GraphDef and the shared PassContext, and returns a PassResult: the (new) graph,
whether it changed the graph (computed, never assumed), and summary lines saying what and why. A failing
pass is reported with its name and the passes that ran before it.

The contract is declared, and checked twice:
- when the PassManager is built: each pass names the PassContext fields it `requires` (set before it runs)
  and the ones it `provides` (sets for later passes), so `PassManager([Partition(), FindStages()])` fails at
  once ("partition requires stages, which no earlier pass provides") instead of running on an empty analysis;
- after each pass runs (as onnx-ir's PassBase does): every field it `provides` has been set; a pass that
  reports no change returns the very GraphDef it was given, and one that reports a change returns a new one
  (passes never edit their input); a StageDef (the stage metadata stored with the graph) changes only in a
  pass that declares it `updates` "stage_defs" (the built-in passes declare none: they record a new StageDef in
  their edit log, passes/stage_defs.py). A pass that breaks it is a PassError naming the pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from tensorflow.core.framework import graph_pb2

from smartstage.config.options import SmartStageOptions
from smartstage.errors import PassError, SmartStageError
from smartstage.graph.stages import StageBoundary
from smartstage.protos import StageDef
from smartstage.passes.verify import verify_graph

logger = logging.getLogger(__name__)


# The PassContext fields that hold what optimize() knows before any pass runs.
GIVEN = frozenset({"options", "targets", "target_ports", "feeds", "stage_defs"})
# What a pass may declare it edits in place besides its graph (today: the StageDef protos).
UPDATABLE = frozenset({"stage_defs"})


@dataclass
class PassContext:
    """What passes share: options, targets and feeds, stage descriptions, and the analyses so far.
    A pass declares which fields it requires and provides (see PassManager); the context records which
    fields have been set since it was made, so the PassManager can check that a pass set what it provides.

    Fields whose types live in the passes that provide them (StagePartition, AutoStageReport,
    StagePlacement, StageStreams) are annotated by name in a comment: naming them here would make this
    module import the passes that import it."""

    options: SmartStageOptions
    targets: set[str] = field(default_factory=set)
    # target node -> the output ports fetched ("x:1" fetches port 1 only); None: every port of a target
    target_ports: dict[str, frozenset[int]] | None = None
    feeds: set[str] = field(default_factory=set)
    stage_defs: list[StageDef] = field(default_factory=list)
    stages: list[StageBoundary] = field(default_factory=list)  # provided by find_stages (and auto_stage)
    partitions: list = field(default_factory=list)  # [StagePartition], provided by partition
    auto_stage: Any = None  # AutoStageReport, provided by auto_stage
    gpu_placement: dict = field(default_factory=dict)  # stage -> StagePlacement, provided by gpu_placement
    multi_stream: dict = field(default_factory=dict)  # stage -> StageStreams, provided by multi_stream
    notes: list[str] = field(default_factory=list)
    _views: dict[int, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_set_fields", set())

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if "_set_fields" in self.__dict__:
            self._set_fields.add(name)

    def has(self, name: str) -> bool:
        """Whether `name` is known: given to optimize(), or set by a pass since the context was made."""
        return name in GIVEN or name in self._set_fields

    def stage_def_bytes(self) -> dict[int, bytes]:
        """Every StageDef the passes can reach, serialized, by object (to see whether a pass edited one;
        a StageDef a pass adds for a stage it inserts is new, not an edit)."""
        reachable = list(self.stage_defs) + [s.stage_def for s in self.stages if s.stage_def is not None]
        return {id(sd): sd.SerializeToString(deterministic=True) for sd in reachable}

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
    edits: tuple = ()  # the graph edits as data (smartstage.graph.edits): what a live session applies too


@dataclass(frozen=True)
class PassReport:
    name: str
    changed: bool
    seconds: float
    summary: tuple[str, ...]
    details: Any = None
    edits: tuple = ()  # PassResult.edits


class Pass(Protocol):
    name: str
    requires: tuple[str, ...]  # PassContext fields this pass reads that some earlier pass must provide
    provides: tuple[str, ...]  # PassContext fields this pass sets
    # Optional: given fields it edits in place (UPDATABLE); a pass without it edits none.
    # updates: tuple[str, ...]

    def run(self, graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult: ...


class PassManager:
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
            stage_defs_before = ctx.stage_def_bytes()
            try:
                result = p.run(graph_def, ctx)
                _check_contract(p, graph_def, result, ctx, stage_defs_before, before)
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
            reports.append(PassReport(p.name, result.changed, seconds, result.summary, result.details,
                                      tuple(result.edits)))
            graph_def = result.graph_def
        return graph_def, reports


def _check_order(passes: list[Pass]) -> None:
    """Every pass declares its contract, and every field it requires is given to optimize() or provided by
    a pass before it."""
    known = set(GIVEN)
    fields_known = {f.name for f in fields(PassContext)}
    for i, p in enumerate(passes):
        before = [q.name for q in passes[:i]]
        name = getattr(p, "name", type(p).__name__)
        for attribute in ("name", "requires", "provides"):
            if not hasattr(p, attribute):
                raise PassError(f"pass {name!r} does not declare {attribute!r}; give its class "
                                f"`{attribute} = ...` (see smartstage.passes.manager.Pass)", name, tuple(before))
        declared = (*p.requires, *p.provides, *getattr(p, "updates", ()))
        unknown = [f for f in declared if f not in fields_known]
        if unknown:
            raise PassError(f"pass {p.name!r} declares {', '.join(unknown)}, which PassContext has no field for "
                            f"(its fields: {', '.join(sorted(f for f in fields_known if not f.startswith('_')))})",
                            p.name, tuple(before))
        not_updatable = [f for f in getattr(p, "updates", ()) if f not in UPDATABLE]
        if not_updatable:
            raise PassError(f"pass {p.name!r} declares it updates {', '.join(not_updatable)} in place; only "
                            f"{', '.join(sorted(UPDATABLE))} may be updated (provide a new field instead)",
                            p.name, tuple(before))
        missing = [f for f in p.requires if f not in known]
        if missing:
            raise PassError(f"pass {p.name!r} requires {', '.join(missing)}, which no earlier pass provides "
                            f"(passes before it: {before or 'none'}); put a pass that provides it first",
                            p.name, tuple(before))
        known.update(p.provides)


def _check_contract(p: Pass, given: graph_pb2.GraphDef, result: PassResult, ctx: PassContext,
                    stage_defs_before: dict[int, bytes], before: tuple[str, ...]) -> None:
    """What a pass promised holds after it ran (onnx-ir's functional-pass identity check, and more)."""
    def broken(message: str) -> PassError:
        return PassError(f"pass {p.name!r} broke its contract: {message}", p.name, before)

    if not isinstance(result, PassResult):
        raise broken(f"it returned {type(result).__name__}, not a PassResult")
    if not result.changed and result.graph_def is not given:
        raise broken("it reports no change but returned a different GraphDef; return the graph it was given "
                     "(PassResult(graph_def, changed=False)) or report the change")
    if result.changed and result.graph_def is given:
        raise broken("it reports a change but returned the GraphDef it was given: passes never edit their input; "
                     "edit a copy and return it")
    unset = [f for f in p.provides if not ctx.has(f)]
    if unset:
        raise broken(f"it declares it provides {', '.join(unset)} but did not set it")
    after = ctx.stage_def_bytes()
    edited = [key for key, value in stage_defs_before.items() if after.get(key, value) != value]
    if edited and "stage_defs" not in getattr(p, "updates", ()):
        raise broken("it edited a StageDef without declaring it; record a new one with "
                     "passes.stage_defs.replace_stage_def (the edit log carries it to the optimizer and the "
                     "session), or add `updates = (\"stage_defs\",)` to the pass")
