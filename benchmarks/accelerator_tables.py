"""The accelerator family's numbers, targets and table (`python -m benchmarks.e2e --accelerator`).

    summary.update(accelerator_targets(summary))   # per repeat: x bare step, x best alternative, x no stage
    text = accelerator_markdown(result, summaries)  # one row per model and device time

The bare step is the training step fed one cached batch (benchmarks/sides.py: a split's training side
alone), of the split that leaves the step the least work: the preprocessed features, or SmartStage's cut
where stateless work follows the features (the id spaces the models combine): no input pipeline can
beat it. The CPU bound is cores / (CPU of the input side + CPU of the training side) per batch, the
higher of the two splits'. Every ratio is taken within one
repeat, then the median and range over repeats are reported (benchmarks/e2e_tables.py does the same).
"""

from __future__ import annotations

import logging
from typing import Any

from benchmarks.e2e_tables import fold_lanes_table
from benchmarks.report import Spread, machine_line, markdown_table
from benchmarks.runners import ALTERNATIVES, CONFIGS_BY_NAME, DEFAULT_SETTING

logger = logging.getLogger(__name__)

TARGET_OF_BARE = 0.95
TARGET_VS_BEST_ALTERNATIVE = 1.1  # where the bare step leaves room ...
ROOM = 1.2  # ... i.e. bare step >= 1.2x the best alternative; else >= 1.0x
HELD = ("smart", "auto_stage")


def _rates(samples: list) -> list[float | None]:
    return [s.steps_per_sec if s is not None else None for s in samples]


def _ratio(a: list, b: list) -> Spread:
    return Spread.of(x / y for x, y in zip(a, b) if x is not None and y)


def bare_and_bound(summary: dict) -> tuple[list[float | None], list[float | None]]:
    """Per repeat: the bare step's steps/s and the CPU bound's (None where the sides were not measured)."""
    return [b.get("bare") for b in summary["bounds"]], [b.get("cpu_bound") for b in summary["bounds"]]


def accelerator_targets(summary: dict) -> dict[str, Any]:
    """The accelerator targets of one workload: SmartStage and auto-stage at the defaults against the bare
    step (>= 0.95), the best alternative (>= 1.1x where the bare step is >= 1.2x it, else >= 1.0x) and no
    stage (>= 1.0x), medians over the per-repeat ratios."""
    rates = {name: _rates(summary["samples"].get((name, DEFAULT_SETTING), [])) for name in CONFIGS_BY_NAME}
    bare, bound = bare_and_bound(summary)
    # Where the CPU bound is below the bare step (short device times), no pipeline on these cores reaches the
    # bare step: the limit is the lower of the two.
    limit = [min(b, c) if b and c else None for b, c in zip(bare, bound)]
    measured = {name: Spread.of(rates[name]) for name in ALTERNATIVES if Spread.of(rates[name]).n}
    best = max(measured, key=lambda name: measured[name].median) if measured else None
    alt = rates[best] if best else []
    room = _ratio(bare, alt)
    required = TARGET_VS_BEST_ALTERNATIVE if room.n and room.median >= ROOM else 1.0
    out: dict[str, Any] = {}
    for name in HELD:
        x = {"of_bare": _ratio(rates[name], bare), "vs_best_alternative": _ratio(rates[name], alt),
             "vs_no_stage": _ratio(rates[name], rates["no_stage"]), "of_cpu_bound": _ratio(rates[name], bound),
             "of_limit": _ratio(rates[name], limit)}
        x["met"] = {f">= {TARGET_OF_BARE} of the bare step": x["of_bare"].median >= TARGET_OF_BARE,
                    f">= {required:g}x best alternative": x["vs_best_alternative"].median >= required,
                    "never below no stage (>= 1.0x)": x["vs_no_stage"].median >= 1.0}
        out[name] = x
    return {"accelerator": {"rates": {name: Spread.of(r) for name, r in rates.items()}, "bare": Spread.of(bare),
                            "cpu_bound": Spread.of(bound), "best_alternative": best, "room": room,
                            "required": required, "targets": out}}


def accelerator_table(summaries: list[dict]) -> str:
    """Steps/s, median (range): every configuration at its defaults, the bare step and the CPU bound."""
    header = ["workload", "no stage", "hand stage", "tf.data prefetch", "preprocessing in map", "SmartStage",
              "auto-stage", "bare step", "CPU bound"]
    rows = []
    for s in summaries:
        a = s["accelerator"]
        rows.append([s["workload"].name] + [a["rates"][n].text(1) for n in
                                            ("no_stage", "staged", "tfdata_prefetch", "tfdata_map", "smart",
                                             "auto_stage")] + [a["bare"].text(1), a["cpu_bound"].text(1)])
    return markdown_table(header, rows)


def ratios_table(summaries: list[dict]) -> str:
    header = ["workload", "configuration", "of the bare step", "x best alternative (which; bar)", "x no stage",
              "of min(bare step, CPU bound)", "targets met"]
    rows = []
    for s in summaries:
        a = s["accelerator"]
        for name in HELD:
            t = a["targets"][name]
            missed = [k for k, ok in t["met"].items() if not ok]
            rows.append([s["workload"].name, CONFIGS_BY_NAME[name].label, t["of_bare"].text(2),
                         f"{t['vs_best_alternative'].text(2)} ({a['best_alternative']}; {a['required']:g}x)",
                         t["vs_no_stage"].text(2), t["of_limit"].text(2),
                         f"{len(t['met']) - len(missed)} of {len(t['met'])}"
                         + ("" if not missed else " (not: " + "; ".join(missed) + ")")])
    return markdown_table(header, rows)


def accelerator_markdown(result: dict, summaries: list[dict]) -> str:
    """The accelerator family's two tables, with where, how and under what load they were measured."""
    machine = result["machine"]
    met = sum(ok for s in summaries for t in s["accelerator"]["targets"].values() for ok in t["met"].values())
    total = sum(len(t["met"]) for s in summaries for t in s["accelerator"]["targets"].values())
    return "\n".join([
        f"Measured by `{result['command'].strip()}` in {result['seconds']:.0f} s on {machine_line(machine)} "
        f"({machine.get('date')}; load average at end {machine['load_average_at_end']}); {result['parameters']['repeats']} interleaved repeats of "
        f"{result['parameters']['steps']} steps, batch {result['parameters']['batch_size']}, median (range); "
        f"ratios within each repeat. Targets met: {met} of {total}.", "",
        "Steps/s:", "", accelerator_table(summaries), "", "SmartStage and auto-stage at the defaults:", "",
        ratios_table(summaries), "", "Folded into the dataset beside the same stage on lanes (fraction of min(bare "
        "step, CPU bound), per repeat):", "", fold_lanes_table(summaries), ""])


def summaries_from_json(path: str) -> tuple[dict, list[dict]]:
    """A written accelerator JSON read back into what accelerator_markdown takes (tables re-made with this code)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks.runners import Workload

    result = json.loads(Path(path).read_text())
    summaries = []
    for w in result["workloads"]:
        samples = {}
        for key, values in w["samples"].items():
            name = key.split(" [")[0]
            if key == f"{name} [{DEFAULT_SETTING.label}]":
                samples[(name, DEFAULT_SETTING)] = [SimpleNamespace(**v) if v else None for v in values]
        summary = {"workload": Workload(**w["workload"]), "samples": samples, "bounds": w["bounds"]}
        summary.update(accelerator_targets(summary))
        summaries.append(summary)
    return result, summaries


if __name__ == "__main__":  # python -m benchmarks.accelerator_tables docs/perf/accelerator.json
    import sys

    result, summaries = summaries_from_json(sys.argv[1])
    print(accelerator_markdown(result, summaries), end="")
