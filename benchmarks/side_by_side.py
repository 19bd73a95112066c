"""Two published runs of one benchmark, side by side: each figure of the older run beside the newer one's.

    python -m benchmarks.side_by_side OLD.json NEW.json              # a Markdown table on stdout
    python -m benchmarks.side_by_side <(git show REV:docs/perf/accelerator.json) docs/perf/accelerator.json

e2e and accelerator runs (`benchmarks.e2e`): per workload and configuration at the defaults, the fraction of
min(bare step, CPU bound) the configuration reached (median and range over the run's interleaved repeats).
Scaling runs (`benchmarks.scaling`): per size, optimize()'s CPU seconds and their ratio to import_graph_def's
in the same run. TF2 runs (`benchmarks.tf2`): per model kind and setting, SmartStage's ratios to the in-model
step and to the hand-written map (median and range over the rounds). Strategy runs (`benchmarks.tf2_strategy`):
per kind and setting, ss.tf2.fit / model.fit. Each run's figures are its own; neither is re-measured here.

Beside each TF2 and strategy ratio, whether the newer run is slower beyond its rounds' spread: a one-sided
permutation test of the two runs' per-round ratios (scipy, in the [report] extra). "p" is the chance, were the
rounds of both runs drawn alike, of a newer median as far below the older one as measured; "slower" from
p < 0.05. Across 30 rows about one in twenty reads "slower" by chance alone; and the test takes the two runs'
rounds as drawn alike, so a host that ran slower through one whole run reads "slower" too. A row whose program
is the same in both runs (a TF2 row where both trials kept the unmodified program) shows how often that happens.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.report import Spread
from benchmarks.runners import CONFIGS_BY_NAME, Workload

def _of_limit(run: dict) -> dict[tuple[str, str], dict]:
    figures = {}
    for workload in run.get("workloads", []):
        for config, targets in workload.get("targets", {}).items():
            spread = targets.get("of_limit") or {}
            if spread.get("n"):
                figures[(Workload(**workload["workload"]).name, config)] = spread
    return figures


def _head(run: dict) -> str:
    machine = run.get("machine", {})
    return f"{machine.get('date', '?')}, load {machine.get('load_average_at_start', ['?'])[0]} at start"


def e2e_table(old: dict, new: dict) -> str:
    """Markdown: fraction of the limit per workload and configuration, old beside new."""
    before, after = _of_limit(old), _of_limit(new)
    lines = [f"| workload | configuration | of the limit, {_head(old)} | of the limit, {_head(new)} | met (>= 0.9) |",
             "|---|---|---|---|---|"]
    keys = list(after) + [k for k in before if k not in after]  # the runs' own order of workloads
    for key in keys:
        old_text = Spread(**before[key]).text(2) if key in before else "-"
        new_text = Spread(**after[key]).text(2) if key in after else "-"
        met = "-" if key not in after else ("yes" if after[key]["median"] >= 0.9 else f"no ({after[key]['median']:.3f})")
        label = CONFIGS_BY_NAME[key[1]].label if key[1] in CONFIGS_BY_NAME else key[1]
        lines.append(f"| {key[0]} | {label} | {old_text} | {new_text} | {met} |")
    return "\n".join(lines)


def scaling_table(old: dict, new: dict) -> str:
    """Markdown: optimize()'s CPU seconds and its ratio to import_graph_def's, per size, old beside new."""
    def rows(run):
        out = {}
        for size, row in run["summary"]["rows"].items():
            optimize, imported = row["optimize"]["cpu_seconds"]["median"], row["import"]["cpu_seconds"]["median"]
            out[int(size)] = (optimize, optimize / imported)
        return out

    before, after = rows(old), rows(new)
    lines = [f"| nodes | optimize() CPU s, {_head(old)} | x import_graph_def | optimize() CPU s, {_head(new)} "
             "| x import_graph_def |", "|---|---|---|---|---|"]
    for size in sorted(set(before) | set(after)):
        o = before.get(size)
        n = after.get(size)
        lines.append(f"| {size:,} | {o[0]:.2f} | {o[1]:.2f}x | " if o else f"| {size:,} | - | - | ")
        lines[-1] += f"{n[0]:.2f} | {n[1]:.2f}x |" if n else "- | - |"
    return "\n".join(lines)


def _setting(device_ms: float) -> str:
    return "CPU" if not device_ms else f"device {device_ms:g} ms"


SLOWER_BELOW = 0.05  # the permutation test's p under which the newer run reads "slower"


def slower_p(old: list[float], new: list[float]) -> float:
    """The one-sided permutation test's p that the newer run's rounds are slower than the older run's: the share
    of the relabelings of the pooled rounds whose newer median lies as far below the older one as measured
    (exact when there are at most 20000 relabelings, else 20000 drawn with a fixed seed).

        before:  medians 1.02 (0.96-1.12) and 0.98 (0.93-1.14): slower, or the rounds' spread?
        after:   slower_p(old, new) -> 0.16: within the spread
    """
    try:
        import numpy as np
        from scipy import stats
    except ImportError as e:
        raise SystemExit("side_by_side: the permutation test needs scipy: pip install -e '.[report]'") from e

    def newer_below(a, b, axis):
        return np.median(a, axis=axis) - np.median(b, axis=axis)

    return float(stats.permutation_test((new, old), newer_below, permutation_type="independent", vectorized=True,
                                        alternative="less", n_resamples=20000, random_state=0).pvalue)


def slower_text(p: float) -> str:
    """A permutation test's p as a table cell: "slower (p 0.01)" below SLOWER_BELOW, else "no (p 0.40)"."""
    return f"{'slower' if p < SLOWER_BELOW else 'no'} (p {p:.2f})"


def _slower(old: list[float] | None, new: list[float] | None) -> str:
    return slower_text(slower_p(old, new)) if old and new else "-"


def _ratio_rows(before: dict, after: dict, label: str) -> list[str]:
    rows = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        rows.append(f"| {key[0]} | {_setting(key[1])} | {label or key[2]} | "
                    f"{Spread.of(old).text(2) if old else '-'} | {Spread.of(new).text(2) if new else '-'} | "
                    f"{_slower(old, new)} |")
    return rows


def _ratio_head(old: dict, new: dict) -> list[str]:
    return [f"| kind | setting | ratio | {_head(old)} | {_head(new)} | newer slower? |", "|---|---|---|---|---|---|"]


def tf2_table(old: dict, new: dict) -> str:
    """Markdown: per kind and setting, SmartStage's ratios (timed split; untimed split) old beside new."""
    names = ("smartstage/in_model", "smartstage/handwritten", "split_untimed/in_model")

    def ratios(run):
        out = {}
        kinds = {"dlrm_step": run.get("settings", [])} | dict(run.get("kinds", {}))
        for kind, settings in kinds.items():
            for setting in settings:
                for name in names:
                    values = setting.get("ratios", {}).get(name, {}).get("values")
                    if values:
                        out[(kind, setting["device_ms"], name)] = values
        return out

    return "\n".join(_ratio_head(old, new) + _ratio_rows(ratios(old), ratios(new), ""))


def tf2_strategy_table(old: dict, new: dict) -> str:
    """Markdown: per kind and setting, ss.tf2.fit / model.fit under the strategy, old beside new."""
    def ratios(run):
        return {(m["kind"], m["device_ms"], ""): m["ratios"] for m in run.get("measured", [])}

    return "\n".join(_ratio_head(old, new) + _ratio_rows(ratios(old), ratios(new), "ss.tf2.fit / model.fit"))


TABLES = {"scaling": scaling_table, "tf2": tf2_table, "tf2_strategy": tf2_strategy_table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.side_by_side", description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the older run's JSON (as published under docs/perf/)")
    parser.add_argument("new", help="the newer run's JSON")
    args = parser.parse_args(argv)
    with open(args.old) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    if old.get("benchmark") != new.get("benchmark"):
        print(f"side_by_side: {args.old} is a {old.get('benchmark')!r} run and {args.new} a {new.get('benchmark')!r} "
              "run; give two runs of one benchmark", file=sys.stderr)
        return 2
    print(TABLES.get(new.get("benchmark"), e2e_table)(old, new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
