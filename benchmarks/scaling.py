"""Scaling benchmark: optimize() against tf.graph_util.import_graph_def and GraphDef parsing, 10^4 to 10^6 nodes.

    python -m benchmarks.scaling              # 10k, 100k, 1M nodes, 3 repeats
    python -m benchmarks.scaling --quick      # 10k, 100k nodes, 2 repeats
    python -m benchmarks.scaling --profile 100000   # + cProfile (process_time) of optimize() on that size

The graphs are realistic training graphs (benchmarks/graphs.py: many feature columns behind one
stage, embeddings, gradients, Adagrad), generated once into benchmarks/out/graphs/.

Every measurement runs in its own subprocess, and all three are measured the same way:
1. import TensorFlow and smartstage; run the operation once on a small graph (lazy imports,
   op registries, Grappler-free warm-up), so the measured call pays only for the graph;
2. load the input (the serialized bytes for parsing, the parsed GraphDef for the others);
3. reset the peak RSS (/proc/self/clear_refs), read RSS, run the operation once, read the peak RSS.
Time is CPU time of the process (time.process_time: the machine is shared) and wall time; memory is
the extra peak: peak RSS during the call minus RSS before it. Measurements of the three operations
and the sizes are interleaved across repeats; medians are reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.report import (  # noqa: E402
    DEFAULT_OUT,
    REPO_ROOT,
    Spread,
    load_average,
    machine_info,
    machine_line,
    markdown_table,
    pyplot,
    write_outputs,
)

OPERATIONS = ("parse", "import", "optimize")
WARMUP_NODES = 2_000
TARGET_TIME_RATIO = 0.2  # optimize / import_graph_def CPU time, at 100k and 1M nodes
# optimize(1M) / optimize(100k) no worse than import_graph_def(1M) / import_graph_def(100k), measured in the same run
TARGET_MEMORY_RATIO = 0.5  # extra peak of optimize / that of import_graph_def

MODES = {
    "full": dict(sizes=(10_000, 100_000, 1_000_000), repeats=3),
    "quick": dict(sizes=(10_000, 100_000), repeats=2),
    "smoke": dict(sizes=(5_000,), repeats=1),
}


# -- one measurement (the subprocess) ---------------------------------------------------------------

def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _operation(name: str):
    """The operation as a function of its input (bytes for parse, a GraphDef otherwise)."""
    import tensorflow as tf

    if name == "parse":
        return lambda data: tf.compat.v1.GraphDef.FromString(data)
    if name == "import":
        def import_graph_def(graph_def):
            graph = tf.Graph()
            with graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
            return graph
        return import_graph_def
    if name == "optimize":
        import smartstage as ss

        config = ss.enable_smart_stage()
        return lambda graph_def: ss.optimize(graph_def, config, targets=["train_op"])
    raise ValueError(f"unknown operation {name!r}; one of {OPERATIONS}")


def measure_once(operation: str, graph_path: Path, warmup_path: Path) -> dict[str, Any]:
    """Runs `operation` once on the graph at `graph_path` in this process; see the module docstring."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    run = _operation(operation)

    def load(path: Path):
        data = path.read_bytes()
        return data if operation == "parse" else tf.compat.v1.GraphDef.FromString(data)

    warm = run(load(warmup_path))
    del warm
    subject = load(graph_path)
    gc.collect()
    exact_peak = _reset_peak()
    rss_before = _status_kib("VmRSS")
    cpu, wall = time.process_time(), time.perf_counter()
    result = run(subject)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = _status_kib("VmHWM")
    out = {
        "operation": operation,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "rss_before_mib": rss_before / 1024,
        "extra_peak_mib": (peak - rss_before) / 1024,
        "exact_peak": exact_peak,
        "nodes": len(subject.node) if operation != "parse" else len(result.node),
        "bytes": graph_path.stat().st_size,
    }
    if operation == "optimize":
        out["passes"] = {r.name: r.seconds for r in result.reports}
        out["moved"] = sum(len(p.moved) for p in result.partitions)
        out["boundary_after"] = sum(len(p.boundary_after) for p in result.partitions)
    return out


def profile_optimize(graph_path: Path, warmup_path: Path, out_path: Path, top: int = 30) -> str:
    """cProfile of one optimize() call (timer: process_time), after a warm-up; returns the top lines."""
    import cProfile
    import io
    import pstats

    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    run = _operation("optimize")
    run(tf.compat.v1.GraphDef.FromString(warmup_path.read_bytes()))
    graph_def = tf.compat.v1.GraphDef.FromString(graph_path.read_bytes())
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    run(graph_def)
    profiler.disable()
    profiler.dump_stats(str(out_path))
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


# -- the driver ---------------------------------------------------------------------------------------

def _subprocess(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"measurement {args} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summarize(samples: dict[int, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    rows = {}
    for size, by_op in sorted(samples.items()):
        row: dict[str, Any] = {}
        for op, runs in by_op.items():
            row[op] = {
                "cpu_seconds": Spread.of(r["cpu_seconds"] for r in runs),
                "wall_seconds": Spread.of(r["wall_seconds"] for r in runs),
                "extra_peak_mib": Spread.of(r["extra_peak_mib"] for r in runs),
                "nodes": runs[0]["nodes"] if runs else None,
            }
            if op == "optimize" and runs:
                row[op]["passes"] = {name: Spread.of(r["passes"][name] for r in runs) for name in runs[0]["passes"]}
                row[op]["moved"] = runs[0]["moved"]
                row[op]["boundary_after"] = runs[0]["boundary_after"]
        if "optimize" in row and "import" in row:
            row["time_ratio"] = row["optimize"]["cpu_seconds"].median / row["import"]["cpu_seconds"].median
            row["wall_ratio"] = row["optimize"]["wall_seconds"].median / row["import"]["wall_seconds"].median
            row["memory_ratio"] = (row["optimize"]["extra_peak_mib"].median
                                   / row["import"]["extra_peak_mib"].median)
        row["bytes"] = by_op[next(iter(by_op))][0]["bytes"] if by_op else None
        rows[size] = row
    targets: dict[str, Any] = {}
    for size in (100_000, 1_000_000):
        if size in rows and "time_ratio" in rows[size]:
            targets[f"time_ratio_{size}"] = rows[size]["time_ratio"]
            targets[f"time_ratio_{size}_met"] = rows[size]["time_ratio"] <= TARGET_TIME_RATIO
    if 100_000 in rows and 1_000_000 in rows:
        growth = (rows[1_000_000]["optimize"]["cpu_seconds"].median
                  / rows[100_000]["optimize"]["cpu_seconds"].median)
        nodes = rows[1_000_000]["optimize"]["nodes"] / rows[100_000]["optimize"]["nodes"]
        import_growth = (rows[1_000_000]["import"]["cpu_seconds"].median
                         / rows[100_000]["import"]["cpu_seconds"].median)
        targets["growth_100k_to_1m"] = growth
        targets["import_growth_100k_to_1m"] = import_growth
        targets["node_growth_100k_to_1m"] = nodes
        targets["growth_met"] = growth <= import_growth
    memory = [rows[s]["memory_ratio"] for s in rows if "memory_ratio" in rows[s] and s >= 100_000]
    if memory:
        targets["memory_ratio_worst"] = max(memory)
        targets["memory_met"] = max(memory) <= TARGET_MEMORY_RATIO
    return {"rows": rows, "targets": targets}


def table(summary: dict[str, Any]) -> str:
    header = ["nodes", "MB", "parse s", "import_graph_def s", "optimize() s", "optimize / import",
              "extra peak MiB: parse", "import", "optimize", "optimize / import"]
    lines = []
    for size, row in summary["rows"].items():
        def cell(op, key, digits):
            return row[op][key].text(digits) if op in row else "-"
        lines.append([
            f"{row['optimize']['nodes'] if 'optimize' in row else size:,}",
            f"{row['bytes'] / 1e6:.1f}" if row.get("bytes") else "-",
            cell("parse", "cpu_seconds", 3), cell("import", "cpu_seconds", 3), cell("optimize", "cpu_seconds", 3),
            f"{row['time_ratio']:.3f}" if "time_ratio" in row else "-",
            cell("parse", "extra_peak_mib", 0), cell("import", "extra_peak_mib", 0),
            cell("optimize", "extra_peak_mib", 0),
            f"{row['memory_ratio']:.2f}" if "memory_ratio" in row else "-",
        ])
    return markdown_table(header, lines)


def passes_table(summary: dict[str, Any]) -> str:
    rows = []
    for size, row in summary["rows"].items():
        if "optimize" not in row:
            continue
        opt = row["optimize"]
        passes = ", ".join(f"{name} {s.median:.3f}" for name, s in opt["passes"].items())
        rows.append([f"{opt['nodes']:,}", opt["moved"], opt["boundary_after"], passes])
    return markdown_table(["nodes", "moved", "boundary tensors", "wall seconds per pass (median)"], rows)


def targets_text(summary: dict[str, Any]) -> str:
    t = summary["targets"]
    mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines = []
    for size in (100_000, 1_000_000):
        if f"time_ratio_{size}" in t:
            lines.append(f"optimize / import_graph_def CPU time at {size:,} nodes: {t[f'time_ratio_{size}']:.3f} "
                         f"({mark(t[f'time_ratio_{size}_met'])}, target <= {TARGET_TIME_RATIO})")
    if "growth_100k_to_1m" in t:
        lines.append(f"optimize() time 1M / 100k: {t['growth_100k_to_1m']:.1f}x for {t['node_growth_100k_to_1m']:.1f}x "
                     f"the nodes ({mark(t['growth_met'])}, target <= import_graph_def's "
                     f"{t['import_growth_100k_to_1m']:.1f}x)")
    if "memory_ratio_worst" in t:
        lines.append(f"extra peak memory of optimize / import_graph_def (worst of >= 100k): "
                     f"{t['memory_ratio_worst']:.2f} ({mark(t['memory_met'])}, target <= {TARGET_MEMORY_RATIO})")
    return "\n".join(lines)


def plot(summary: dict[str, Any]):
    plt = pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [row["optimize"]["nodes"] for row in summary["rows"].values() if "optimize" in row]
    for op, label in (("parse", "GraphDef parsing"), ("import", "import_graph_def"), ("optimize", "optimize()")):
        rows = [row for row in summary["rows"].values() if op in row]
        xs = [row[op]["nodes"] for row in rows]
        ys = [row[op]["cpu_seconds"].median for row in rows]
        left.plot(xs, ys, marker="o", label=label)
        right.plot(xs, [row[op]["extra_peak_mib"].median for row in rows], marker="o", label=label)
    if sizes:
        left.plot(sizes, [TARGET_TIME_RATIO * row["import"]["cpu_seconds"].median
                          for row in summary["rows"].values() if "import" in row],
                  linestyle=":", color="red", label=f"target: {TARGET_TIME_RATIO} x import")
    for ax, ylabel in ((left, "CPU seconds (median)"), (right, "extra peak RSS, MiB (median)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("graph nodes")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="10k and 100k nodes, 2 repeats")
    mode.add_argument("--smoke", action="store_true", help="one 5k-node graph, 1 repeat (a test)")
    parser.add_argument("--sizes", help="comma-separated node counts (overrides the mode)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--profile", type=int, metavar="NODES", help="also cProfile optimize() on this size")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--publish", action="store_true", help="also copy the JSON and PNG to docs/perf/")
    parser.add_argument("--measure", choices=OPERATIONS, help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument("--graph", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warmup-graph", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    preset = MODES[args.mode]
    args.sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else preset["sizes"]
    args.repeats = args.repeats or preset["repeats"]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure_once(args.measure, args.graph, args.warmup_graph)))
        return 0
    import tensorflow as tf

    from benchmarks.graphs import cached_graph

    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    started = time.perf_counter()
    machine = machine_info()
    warmup = cached_graph(args.out, WARMUP_NODES)
    paths = {}
    for size in args.sizes:
        begun = time.perf_counter()
        paths[size] = cached_graph(args.out, size)
        _progress(f"graph of ~{size:,} nodes: {paths[size]} ({time.perf_counter() - begun:.1f} s)")
    samples: dict[int, dict[str, list]] = {size: {op: [] for op in OPERATIONS} for size in args.sizes}
    rng = random.Random(0)
    errors = []
    for repeat in range(args.repeats):
        order = [(size, op) for size in args.sizes for op in OPERATIONS]
        rng.shuffle(order)
        for size, op in order:
            try:
                sample = _subprocess(["--measure", op, "--graph", str(paths[size]), "--warmup-graph", str(warmup)])
            except RuntimeError as error:
                errors.append(str(error))
                _progress(f"ERROR: {error}")
                continue
            samples[size][op].append(sample)
            _progress(f"  repeat {repeat + 1} {size:>9,} {op:9} cpu {sample['cpu_seconds']:8.3f} s  wall "
                      f"{sample['wall_seconds']:8.3f} s  extra peak {sample['extra_peak_mib']:8.1f} MiB")
    summary = summarize(samples)
    profile_text = None
    if args.profile:
        path = cached_graph(args.out, args.profile)
        args.out.mkdir(parents=True, exist_ok=True)
        profile_text = profile_optimize(path, warmup, args.out / f"optimize-{args.profile}.prof")
    machine["load_average_at_end"] = load_average()
    result = {
        "benchmark": "scaling",
        "command": "python -m benchmarks.scaling " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": args.mode,
        "machine": machine,
        "parameters": {"sizes": args.sizes, "repeats": args.repeats, "warmup_nodes": WARMUP_NODES},
        "summary": summary,
        "samples": samples,
        "profile": profile_text,
        "errors": errors,
        "seconds": round(time.perf_counter() - started, 1),
    }
    figure = plot(summary)
    lines = [f"# Scaling benchmark ({args.mode}): {result['command']}",
             f"Machine: {machine_line(machine)}; load average at end {machine['load_average_at_end']}", "",
             "CPU seconds (process_time) and extra peak RSS, median (range) of "
             f"{args.repeats} run(s), each in its own process:", "",
             table(summary), "", passes_table(summary), "", targets_text(summary)]
    if profile_text:
        lines.append(f"\ncProfile of optimize() on {args.profile:,} nodes (process_time):\n{profile_text}")
    lines += [f"ERROR: {error}" for error in errors]
    text = "\n".join(lines) + "\n"
    written = write_outputs(args.out, "scaling", result, figure, publish=args.publish, text=text)
    print(text, end="")
    print(f"\nTotal {result['seconds']:.0f} s. Wrote: {', '.join(str(p) for p in written)}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
