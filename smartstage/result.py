"""OptimizeResult: what optimize() returns, the rewritten graph, each pass's report and each stage's
partition, and its text summary (per stage what moved, what stayed and why, what crosses).

    result = ss.optimize(graph_def, config)
    result.graph_def; result.summary(); result.fetch_map()   # {"hash:0": "stage/take:1", ...}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.config.options import SmartStageOptions
from smartstage.graph.stage_names import DATASET_FOLD_SCOPE, FOLDED_READ
from smartstage.graph.stages import INPUTS
from smartstage.passes.manager import PassReport

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
        if stage.kind == INPUTS:
            lines.append(f"stage {stage.name!r} (the graph's inputs: {_listed(stage.inputs)})")
        else:
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
            through = "across the inputs' boundary" if stage.kind == INPUTS else "through put/take"
            lines.append(f"  control edges re-routed {through}: "
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


@dataclass(frozen=True)
class OptimizeResult:
    """The rewritten graph (the input is never mutated), what each pass did, and each stage's partition."""

    graph_def: graph_pb2.GraphDef
    original_graph_def: graph_pb2.GraphDef  # the input as given (the caller's own GraphDef when one was passed)
    options: SmartStageOptions
    reports: tuple[PassReport, ...] = ()
    partitions: tuple = ()  # StagePartition per stage
    meta_graph_def: meta_graph_pb2.MetaGraphDef | None = None
    targets: frozenset = frozenset()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    auto_stage: Any = None  # AutoStageReport: the stages auto-stage inserted, and why other sources stayed
    gpu_placement: dict = field(default_factory=dict)  # stage -> StagePlacement (do_smart_stage_gpu)
    multi_stream: dict = field(default_factory=dict)  # stage -> StreamReport (stage_multi_stream)

    @property
    def extra(self) -> dict:
        """The per-pass reports by pass name, as the result gave them before they were typed fields."""
        found = {"auto_stage": self.auto_stage, "gpu_placement": self.gpu_placement, "multi_stream": self.multi_stream}
        return {k: v for k, v in found.items() if v}

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.reports)

    @property
    def passes(self) -> list[str]:
        return [r.name for r in self.reports]

    def moved(self) -> set[str]:
        return {n for p in self.partitions if p.changes_graph for n in p.moved}

    def fetch_map(self) -> dict[str, str]:
        """For each tensor now computed on the prefetch side and carried by a buffer: the take output that
        carries it ("hash:0" -> "stage/take:1"). A session maps fetches through this, so a fetch of a moved
        tensor returns the value of the batch being trained on. An output of the old take (what staged()
        returned) that still crosses maps to the new take output carrying it ("stage/take:0" -> "stage/take:2");
        name it in `targets` to keep it crossing. A stage folded into its dataset has no take: its tensors map to
        the iterator read that yields them, in the same order ("hash:0" -> "stage/dataset_fold/IteratorGetNext:1")."""
        names = {node.name for node in self.graph_def.node}
        mapping = {}
        for p in self.partitions:
            if p.stage.kind == INPUTS:
                continue  # no buffer in the graph: what crosses is handed over outside it (a TF2 split's dataset)
            folded = f"{p.stage.name}/{DATASET_FOLD_SCOPE}/{FOLDED_READ}"
            reader = folded if folded in names and p.stage.take not in names else p.stage.take
            if not p.changes_graph and reader == p.stage.take:
                continue
            slot = {tensor: j for j, tensor in enumerate(p.boundary_after)}
            for tensor, j in slot.items():
                mapping[tensor] = f"{reader}:{j}"
            for k, carried in enumerate(p.take_ports):  # what staged() returned: the old take's outputs
                if carried in slot:
                    mapping[f"{p.stage.take}:{k}"] = f"{reader}:{slot[carried]}"
        return mapping

    def summary(self) -> str:
        """Per stage: moved, pinned (with reasons), boundary tensors before and after; then the passes."""
        return summary_text(self)

    def diff(self):
        """The GraphDiff of the input and the rewritten graph (the same as ss.graph_diff(original, graph, result)).

        A convenience on the result, so `result.diff()` needs no second import; it is the one import of
        the core from the inspection layer (tests/test_layers.py allows exactly this one)."""
        from smartstage.inspection.diff import graph_diff

        return graph_diff(self.original_graph_def, self.graph_def, result=self)
