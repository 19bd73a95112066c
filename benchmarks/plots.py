"""Plots of published benchmark results, drawn from their JSON (the README's headline picture among them).

    result = json.loads(Path("docs/perf/accelerator.json").read_text())
    plot_accelerator(result, "docs/perf/accelerator.png")   # fraction of the bare step per device time

Each plot reads only what the benchmark wrote, so a published JSON can be re-plotted at any time:

    python -m benchmarks.plots docs/perf/accelerator.json docs/perf/accelerator.png
    python -m benchmarks.plots docs/perf/tf2.json docs/perf/tf2.png

A benchmark's `--publish` draws the same figure from its in-memory result, e.g. in benchmarks/e2e.py:

    figure = plots.accelerator_figure(result)      # written as docs/perf/accelerator.png by write_outputs

matplotlib is in the `report` extra (`pip install -e ".[report]"`); without it these functions raise
`PlotError` saying so.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.report import Spread, pyplot

# The accelerator family's configurations, in the order a reader compares them, with their labels and styles.
ACCELERATOR_LINES: tuple[tuple[str, str, str], ...] = (
    ("no_stage", "no stage", ":"),
    ("tfdata_prefetch", "tf.data prefetch", "--"),
    ("tfdata_map", "preprocessing in the tf.data map", "--"),
    ("staged", "hand stage (staged(), flag off, lanes)", "-."),
    ("staged_fold", "hand stage folded (staged(), flag off)", "-."),
    ("smart", "SmartStage (staged() + flag)", "-"),
    ("smart_lanes", "SmartStage on lanes", ":"),
    ("auto_stage", "SmartStage auto-stage", "-"),
    ("auto_stage_lanes", "SmartStage auto-stage on lanes", ":"),
)
TF2_PROGRAMS: tuple[tuple[str, str], ...] = (
    ("in_model", "preprocessing in the step"),
    ("handwritten", "hand-written dataset.map"),
    ("smartstage", "ss.tf2.split(measure=True)"),
    ("split_untimed", "ss.tf2.split(measure=False)"),
)


class PlotError(RuntimeError):
    """A plot cannot be drawn: matplotlib is missing, or the result has none of what the plot needs."""


def _spread(values: list[float]) -> Spread | None:
    spread = Spread.of(values)
    return spread if spread.n else None


def _pyplot():
    plt = pyplot()
    if plt is None:
        raise PlotError("matplotlib is not installed: pip install -e '.[report]' to draw plots")
    return plt


def _plain(result: Any) -> dict[str, Any]:
    """The result as its JSON file holds it: a benchmark's in-memory result (dataclasses, tuples) or the
    file's dict give the same plot."""
    from benchmarks.report import to_jsonable

    return json.loads(json.dumps(to_jsonable(result), default=str))


def _setting_key(samples: dict[str, list], name: str) -> str | None:
    """The sample key of a configuration at its defaults ('smart [AUTOTUNE (defaults)]'), or the bare name."""
    for key in samples:
        if key == name or key.startswith(name + " ["):
            return key
    return None


def accelerator_fractions(result: dict[str, Any]) -> dict[str, dict[str, list[tuple[float, Spread]]]]:
    """Per model and configuration: (device ms, fraction of the bare step) points, sorted by device time.

    The fraction is taken within each repeat (that repeat's steps/s over that repeat's bare step), then
    the median and range of the repeats, as the benchmark's own tables do. The pseudo-configuration
    'cpu_bound' is the 2-core CPU bound over the bare step: above 1, the device is the limit.
    """
    result = _plain(result)
    out: dict[str, dict[str, list[tuple[float, Spread]]]] = {}
    for entry in result.get("workloads", []):
        workload = entry["workload"]
        bounds = entry.get("bounds") or []
        bare = [b.get("bare") if b else None for b in bounds]
        per_model = out.setdefault(workload["model"], {})
        device_ms = float(workload["device_ms"])
        known = [name for name, _, _ in ACCELERATOR_LINES]
        others = sorted({key.split(" [")[0] for key in entry.get("samples", {})} - set(known))
        for name in known + others:
            key = _setting_key(entry.get("samples", {}), name)
            if key is None:
                continue
            ratios = [s["steps_per_sec"] / b for s, b in zip(entry["samples"][key], bare)
                      if s and b and s.get("steps_per_sec")]
            spread = _spread(ratios)
            if spread is not None:
                per_model.setdefault(name, []).append((device_ms, spread))
        bound = _spread([b["cpu_bound"] / b["bare"] for b in bounds if b and b.get("cpu_bound") and b.get("bare")])
        if bound is not None:
            per_model.setdefault("cpu_bound", []).append((device_ms, bound))
    for per_model in out.values():
        for points in per_model.values():
            points.sort(key=lambda p: p[0])
    if not out:
        raise PlotError("the result has no accelerator workloads to plot (is it an accelerator-family JSON?)")
    return out


def accelerator_figure(result: dict[str, Any]):
    """A matplotlib Figure: one panel per model, fraction of the bare step against the emulated device time."""
    plt = _pyplot()
    fractions = accelerator_fractions(result)
    models = sorted(fractions)
    cores = result.get("machine", {}).get("cores") if isinstance(result, dict) else None
    fig, axes = plt.subplots(1, len(models), figsize=(5.4 * len(models), 4.2), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        lines = fractions[model]
        # The known configurations in their order and styles, then any other the run measured, by name.
        extra = [(name, name.replace("_", " "), "-") for name in sorted(lines)
                 if name != "cpu_bound" and name not in {n for n, _, _ in ACCELERATOR_LINES}]
        for name, label, style in (*ACCELERATOR_LINES, *extra):
            points = lines.get(name)
            if not points:
                continue
            xs = [p[0] for p in points]
            medians = [p[1].median for p in points]
            errors = [[p[1].median - p[1].low for p in points], [p[1].high - p[1].median for p in points]]
            width = 2.2 if name in ("smart", "auto_stage") else 1.2
            ax.errorbar(xs, medians, yerr=errors, linestyle=style, marker="o", markersize=4, linewidth=width,
                        capsize=2, label=label)
        if lines.get("cpu_bound"):
            xs = [p[0] for p in lines["cpu_bound"]]
            ax.plot(xs, [min(p[1].median, 1.0) for p in lines["cpu_bound"]], color="grey", linewidth=6, alpha=0.25,
                    label=f"limit: min(bare step, {f'{cores}-core ' if cores else ''}CPU bound)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xticks(sorted({p[0] for pts in lines.values() for p in pts}))
        ax.get_xaxis().set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.get_xaxis().set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("emulated device time per step (ms)")
        ax.set_title(f"{model}-like model")
        ax.set_ylim(0, 1.1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("steps/s as a fraction of the bare step")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    date = result.get("machine", {}).get("date", "")
    command = str(result.get("command", "")).strip()
    fig.suptitle(f"Input pipeline beside an emulated accelerator step (1.0 = no input cost)\n{command}  {date}",
                 fontsize=9)
    fig.tight_layout()
    return fig


def tf2_figure(result: dict[str, Any]):
    """A matplotlib Figure: steps/s of each TF2 program per setting (CPU, emulated accelerator), median and range."""
    plt = _pyplot()
    result = _plain(result)
    settings = result.get("settings") or []
    if not settings:
        raise PlotError("the result has no settings to plot (is it a benchmarks.tf2 JSON?)")
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.8 / len(TF2_PROGRAMS)
    labels = []
    for i, setting in enumerate(settings):
        device_ms = float(setting.get("device_ms", 0.0))
        labels.append("CPU" if device_ms == 0 else f"emulated accelerator, {device_ms:g} ms a step")
        for j, (name, label) in enumerate(TF2_PROGRAMS):
            spread = setting["steps_per_second"].get(name, {}).get("spread")
            if not spread:
                continue
            x = i + (j - (len(TF2_PROGRAMS) - 1) / 2) * width
            ax.bar(x, spread["median"], width, yerr=[[spread["median"] - spread["low"]], [spread["high"] - spread["median"]]],
                   capsize=3, label=label if i == 0 else None, color=f"C{j}")
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("steps/s (median, range)")
    ax.legend(fontsize=8)
    date = result.get("machine", {}).get("date", "")
    ax.set_title(f"TF2 step: {str(result.get('command', '')).strip()}  {date}", fontsize=9)
    fig.tight_layout()
    return fig


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_accelerator(result: dict[str, Any], path: str | Path) -> Path:
    """Writes the accelerator family's plot (fraction of the bare step per device time) as a PNG at path."""
    return _save(accelerator_figure(result), path)


def plot_tf2(result: dict[str, Any], path: str | Path) -> Path:
    """Writes the TF2 benchmark's plot (steps/s per program and setting) as a PNG at path."""
    return _save(tf2_figure(result), path)


def plot_file(json_path: str | Path, png_path: str | Path) -> Path:
    """Plots a published result file, choosing the plot by its "benchmark"/"mode" fields."""
    result = json.loads(Path(json_path).read_text())
    if result.get("benchmark") == "tf2":
        return plot_tf2(result, png_path)
    return plot_accelerator(result, png_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__.splitlines()[0])
    parser.add_argument("json", help="a published result, e.g. docs/perf/accelerator.json or docs/perf/tf2.json")
    parser.add_argument("png", help="where to write the plot")
    args = parser.parse_args(argv)
    print(plot_file(args.json, args.png))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
