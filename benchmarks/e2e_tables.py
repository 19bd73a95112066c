"""The end-to-end benchmark's derived numbers, targets and tables (benchmarks/e2e.py measures).

    summary.update(targets(summary))        # per-repeat ratios of the defaults, targets met / not met
    text = report_text(result, summaries)   # the full report (benchmarks/out/e2e-latest.md)
    short = summary_markdown(result, summaries)  # the tables docs/performance.md links (docs/perf/e2e-summary.md)

Every ratio is taken within one repeat (both configurations timed in the same shuffled round, so
drifting load hits both), then the median and range over repeats are reported.
"""

from __future__ import annotations

import logging
from typing import Any

from benchmarks.report import Spread, machine_line, markdown_table, pyplot
from benchmarks.runners import ALTERNATIVES, CONFIGS, CONFIGS_BY_NAME, DEFAULT_SETTING, FOLD_PAIRS, SMART

logger = logging.getLogger(__name__)

TARGET_VS_OWN_BEST = 0.95
TARGET_OF_LIMIT = 0.9
TARGET_VS_BEST_ALTERNATIVE = 1.1  # where the limit leaves room ...
ROOM = 1.2  # ... i.e. limit >= 1.2x the best alternative; else >= 1.0x
TUNED = ("smart", "auto_stage")  # held to every target; smart_prefetch to "never below no stage"


def _rates(samples: list) -> list[float | None]:
    return [s.steps_per_sec if s is not None else None for s in samples]


def _ratio(a: list, b: list) -> Spread:
    return Spread.of(x / y for x, y in zip(a, b) if x is not None and y)


def _highest_median(points: dict[Any, list]) -> Any:
    """The key whose rates have the highest median (the grid's best point)."""
    return max(points, key=lambda key: Spread.of(points[key]).median)


def held_out_ratio(default: list, points: dict[Any, list]) -> Spread:
    """default / the grid's best point, where the best is picked on the other repeats (leave one out).

    The in-sample best (picked on the same repeats it is compared in) is the highest of several noisy
    medians, biased upward under noise; held out, it is what a user gets who tuned on earlier runs.
    """
    ratios = []
    for r, value in enumerate(default):
        others = {key: [v for i, v in enumerate(rates) if i != r and v is not None] for key, rates in points.items()}
        others = {key: rates for key, rates in others.items() if rates and r < len(points[key]) and points[key][r]}
        if value is None or not others:
            continue
        ratios.append(value / points[_highest_median(others)][r])
    return Spread.of(ratios)


def _best(summary: dict, name: str, include_default: bool) -> tuple[Any, Spread]:
    points = {setting: _rates(v) for (n, setting), v in summary["samples"].items()
              if n == name and (include_default or setting != DEFAULT_SETTING) and Spread.of(_rates(v)).n}
    if not points:
        return None, Spread.of([])
    best = _highest_median(points)
    return best, Spread.of(points[best])


def targets(summary: dict) -> dict[str, Any]:
    samples = summary["samples"]
    rates = {key: _rates(v) for key, v in samples.items()}
    limit = [b.get("limit") for b in summary["bounds"]]
    rows: dict[str, Any] = {}
    for c in CONFIGS:
        default = rates.get((c.name, DEFAULT_SETTING), [])
        best, best_spread = _best(summary, c.name, include_default=not c.has_stage)
        rows[c.name] = {"label": c.label, "default": Spread.of(default),
                        "best_label": best.label if best is not None else "-", "best": best_spread,
                        "cpu_ms": Spread.of(s.cpu_ms_per_step for s in samples.get((c.name, DEFAULT_SETTING), [])
                                            if s is not None)}
    alternatives = [(name, *_best(summary, name, include_default=True)) for name in ALTERNATIVES]
    alternatives = [a for a in alternatives if a[1] is not None]
    alt_name, alt_setting, alt_spread = max(alternatives, key=lambda a: a[2].median)
    alt = rates[(alt_name, alt_setting)]
    no_stage = rates.get(("no_stage", DEFAULT_SETTING), [])
    room = _ratio(limit, alt)
    required = TARGET_VS_BEST_ALTERNATIVE if room.n and room.median >= ROOM else 1.0
    out: dict[str, Any] = {}
    for name in SMART:
        default = rates.get((name, DEFAULT_SETTING), [])
        own, _ = _best(summary, name, include_default=False)
        x = {
            "vs_own_best": _ratio(default, rates[(name, own)]) if own is not None else Spread.of([]),
            "own_best_label": own.label if own is not None else "-",
            "vs_own_best_held_out": held_out_ratio(default, {setting: rates[(n, setting)] for (n, setting) in rates
                                                             if n == name and setting != DEFAULT_SETTING}),
            "of_limit": _ratio(default, limit),
            "vs_best_alternative": _ratio(default, alt),
            "vs_no_stage": _ratio(default, no_stage),
        }
        x["met"] = {
            "never below no stage (>= 1.0x)": x["vs_no_stage"].median >= 1.0,
        }
        if name in TUNED:
            own_best = {} if CONFIGS_BY_NAME[name].folds else {  # folded: no runtime setting to compare with
                f">= {TARGET_VS_OWN_BEST}x own best grid point": x["vs_own_best"].median >= TARGET_VS_OWN_BEST}
            x["met"] = {
                **own_best,
                f">= {required:g}x best alternative": x["vs_best_alternative"].median >= required,
                f">= {TARGET_OF_LIMIT} of the limit": x["of_limit"].median >= TARGET_OF_LIMIT,
                **x["met"],
            }
        out[name] = x
    return {"rows": rows, "best_alternative": f"{alt_name} [{alt_setting.label}]",
            "best_alternative_spread": alt_spread, "limit_room": room, "required_vs_best_alternative": required,
            "targets": out}


def _ran(summary: dict, name: str) -> bool:
    """Whether the run measured configuration `name` at all (a family may leave some out, e.g. the
    accelerator family's SmartStage + tf.data prefetch): a row of dashes says nothing."""
    return any((config == name) for config, _setting in summary["samples"])


def workload_table(summary: dict) -> str:
    header = ["configuration", "defaults: steps/s", "x no stage", "best grid point", "steps/s", "CPU ms/step"]
    no_stage = [s.steps_per_sec if s is not None else None for s in summary["samples"].get(("no_stage", DEFAULT_SETTING), [])]
    rows = []
    for (name, row) in summary["rows"].items():
        if not _ran(summary, name):
            continue
        default = _rates(summary["samples"].get((name, DEFAULT_SETTING), []))
        rows.append([row["label"], row["default"].text(1), _ratio(default, no_stage).text(2), row["best_label"],
                     row["best"].text(1), row["cpu_ms"].text(1)])
    return markdown_table(header, rows)


def defaults_table(summaries: list[dict]) -> str:
    header = ["workload", "configuration", "x own best grid point", "(held out)", "of the limit",
              "x best alternative", "x no stage", "autotune settled after"]
    rows = []
    for s in summaries:
        for name in SMART:
            if not _ran(s, name):
                continue
            t = s["targets"][name]
            settle = s["settle"].get(name, {})
            chose = "; ".join(f"{lanes} lanes, capacity {cap}" for lanes, cap, _ in settle.get("decisions", []))
            settled = ("folded: tf.data tunes" if settle.get("folded") else
                       f"{settle['steps']} steps, {settle['seconds']} s ({chose})" if settle.get("settled")
                       else f"not settled ({settle.get('steps', '-')} steps)")
            if settle.get("not_folded"):
                settled = f"not folded (lanes): {settled}"
            rows.append([s["workload"].name, s["rows"][name]["label"], t["vs_own_best"].text(2),
                         t["vs_own_best_held_out"].text(2), t["of_limit"].text(2),
                         t["vs_best_alternative"].text(2), t["vs_no_stage"].text(2), settled])
    return markdown_table(header, rows)


def targets_table(summaries: list[dict]) -> str:
    header = ["workload", "configuration", "target", "measured (median, range)", "met"]
    rows = []
    keys = {">= 0.95": "vs_own_best", "best alternative": "vs_best_alternative", "limit": "of_limit",
            "no stage": "vs_no_stage"}
    for s in summaries:
        for name in SMART:
            t = s["targets"][name]
            for target, met in t["met"].items():
                key = next(v for k, v in keys.items() if k in target)
                rows.append([s["workload"].name, s["rows"][name]["label"], target, t[key].text(2),
                             "n/a (not measured)" if not t[key].n else "met" if met else "**not met**"])
    return markdown_table(header, rows)


def bare_cpu_limit(summary: dict) -> list[float | None]:
    """Per repeat: min(the bare step, the CPU bound) in steps/s, both measured in that repeat (None: not measured)."""
    return [min(b["bare"], b["cpu_bound"]) if b.get("bare") and b.get("cpu_bound") else None
            for b in summary["bounds"]]


def fold_lanes_rows(summary: dict) -> list[dict[str, Any]]:
    """Each (folded, lanes) pair of FOLD_PAIRS the run measured: steps/s at the defaults and the fraction of
    min(bare step, CPU bound), both median (range) over the repeats, and folded / lanes within each repeat."""
    limit = bare_cpu_limit(summary)
    rows = []
    for folded, lanes in FOLD_PAIRS:
        if not (_ran(summary, folded) and _ran(summary, lanes)):
            continue
        a = _rates(summary["samples"].get((folded, DEFAULT_SETTING), []))
        b = _rates(summary["samples"].get((lanes, DEFAULT_SETTING), []))
        rows.append({"folded": folded, "lanes": lanes, "folded_rate": Spread.of(a), "lanes_rate": Spread.of(b),
                     "folded_of_limit": _ratio(a, limit), "lanes_of_limit": _ratio(b, limit),
                     "folded_vs_lanes": _ratio(a, b)})
    return rows


def fold_lanes_table(summaries: list[dict]) -> str:
    """Folded stages beside the same stages on lanes, every pair measured in the same interleaved repeats."""
    header = ["workload", "folded", "steps/s", "of the limit", "on lanes", "steps/s", "of the limit",
              "folded / lanes", "limit: min(bare step, CPU bound)"]
    rows = []
    for s in summaries:
        limit = Spread.of(bare_cpu_limit(s))
        for r in s.get("fold_lanes", []):
            label = CONFIGS_BY_NAME[r["folded"]].label
            if s["settle"].get(r["folded"], {}).get("not_folded"):  # fold_dataset kept its lanes: see the notes
                label += " (not folded: lanes)"
            rows.append([s["workload"].name, label, r["folded_rate"].text(1),
                         r["folded_of_limit"].text(2), CONFIGS_BY_NAME[r["lanes"]].label, r["lanes_rate"].text(1),
                         r["lanes_of_limit"].text(2), r["folded_vs_lanes"].text(2), limit.text(1)])
    return markdown_table(header, rows)


def sides_line(summary: dict) -> str:
    parts = []
    for split, label in (("input", "input pipeline | model"), ("smart", "SmartStage's cut")):
        s = summary["sides_ms"][split]
        if s["t_in"].n:
            parts.append(f"{label}: input side {s['t_in'].median:.1f} ms (CPU {s['cpu_in'].median:.1f}), "
                         f"training side {s['t_train'].median:.1f} ms (CPU {s['cpu_train'].median:.1f})")
    b = summary["bounds_k"]
    parts.append(f"ideal bound {b['ideal'].median:.1f} steps/s, limit (k={summary['limit_threads']}) "
                 f"{b['limit'].median:.1f} steps/s ({b['limit_available'].median:.1f} with the "
                 f"{b['available_cores'].median:.2f} cores measured free); best alternative "
                 f"{summary['best_alternative']} {summary['best_alternative_spread'].text(1)}; "
                 f"limit / best alternative {summary['limit_room'].text(2)} (so the bar is "
                 f"{summary['required_vs_best_alternative']:g}x)")
    return "; ".join(parts)


def report_text(result: dict, summaries: list[dict]) -> str:
    machine = result["machine"]
    lines = [f"# End-to-end benchmark ({result['mode']}): {result['command']}",
             f"Machine: {machine_line(machine)}; load average at end {machine['load_average_at_end']}"]
    for summary in summaries:
        w = summary["workload"]
        lines += ["", f"## {w.name}: batch {w.batch_size}, read latency {w.read_latency_ms:g} ms/batch, "
                      f"{summary['seconds']:.0f} s", sides_line(summary), "", workload_table(summary)]
        lines += [f"ERROR: {error}" for error in summary["errors"]]
    lines += ["", "## The defaults (AUTOTUNE), ratios within each repeat", "", defaults_table(summaries),
              "", "## Folded into the dataset, and on lanes", "", fold_lanes_table(summaries),
              "", "## Targets", "", targets_table(summaries)]
    return "\n".join(lines) + "\n"


def summary_markdown(result: dict, summaries: list[dict]) -> str:
    """The two tables docs/performance.md links, with where and how they were measured."""
    machine = result["machine"]
    return "\n".join([
        f"Measured by `{result['command'].strip()}` in {result['seconds']:.0f} s on {machine_line(machine)} "
        f"({machine.get('date')}; load average at end {machine['load_average_at_end']}); "
        f"{result['parameters']['repeats']} interleaved repeats, median (range) of per-repeat ratios.",
        "",
        defaults_table(summaries), "", fold_lanes_table(summaries), "", targets_table(summaries), ""])


def plot(summaries: list[dict]):
    plt = pyplot()
    if plt is None:
        logger.warning("matplotlib is not installed (pip install -e '.[report]'): no PNG")
        return None
    fig, axes = plt.subplots(1, len(summaries), figsize=(5.2 * len(summaries), 4.6), squeeze=False)
    for ax, summary in zip(axes[0], summaries):
        names = list(summary["rows"])
        for j, kind in enumerate(("default", "best")):
            xs, ys, lo, hi = [], [], [], []
            for i, name in enumerate(names):
                sp = summary["rows"][name][kind]
                if sp.n:
                    xs.append(i + (j - 0.5) * 0.38)
                    ys.append(sp.median)
                    lo.append(sp.median - sp.low)
                    hi.append(sp.high - sp.median)
            ax.bar(xs, ys, width=0.36, yerr=[lo, hi], capsize=3, label="defaults" if kind == "default" else
                   "best grid point", color=("#4C72B0" if kind == "default" else "#DD8452"))
        bounds = summary["bounds_k"]
        if bounds["limit"].n:
            ax.axhline(bounds["limit"].median, color="red", linestyle=":", label=f"limit (k={summary['limit_threads']})")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_ylabel("global steps/sec (median, range)")
        ax.set_title(summary["workload"].name)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def held_out_from_json(path: str) -> list[tuple[str, str, Spread, Spread]]:
    """(workload, configuration, in-sample, held-out) x own best grid point, from a written e2e JSON."""
    import json
    from pathlib import Path

    out = []
    for w in json.loads(Path(path).read_text())["workloads"]:
        spec = w["workload"]
        name = f"{spec['model']}/{spec['variant']}" + ("/1 core per side" if spec["one_core_per_side"] else "")
        for config in SMART:
            points = {key: [s["steps_per_sec"] if s else None for s in samples]
                      for key, samples in w["samples"].items() if key.startswith(f"{config} [")}
            default = points.pop(f"{config} [{DEFAULT_SETTING.label}]", [])
            if not points:
                continue
            best = points[_highest_median(points)]
            out.append((name, config, _ratio(default, best), held_out_ratio(default, points)))
    return out


if __name__ == "__main__":  # python -m benchmarks.e2e_tables docs/perf/e2e.json
    import sys

    for workload, config, in_sample, held in held_out_from_json(sys.argv[1]):
        print(f"{workload:32} {config:16} x own best grid point {in_sample.text(2):18} held out {held.text(2)}")
