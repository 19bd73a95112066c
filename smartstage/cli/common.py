"""What every `smartstage` command shares: exit codes, the one-line failure, loading a graph, `--feed`
values, the summary table and progress on a terminal (files are written by smartstage.cli.outputs).

    graph = load_input("model.meta")          # a LoadedGraph, or CommandFailed("cannot read model.meta: ...")
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandFailed(Exception):
    """A one-line error from the CLI itself (bad paths and flags found after parsing)."""


def print_error(message: str) -> None:
    message = " ".join(message.split())  # one line, whatever the message held
    print(f"smartstage: error: {message}", file=sys.stderr)


def options_from_args(args, gpu: bool = False):
    from smartstage.config.options import enable_smart_stage

    return enable_smart_stage(do_smart_stage_gpu=gpu, auto_stage=True if args.auto_stage else None, **scale_out_options(args))


def scale_out_options(args) -> dict:
    """The scale-out flags as SmartStageOptions fields: --input-job/--input-tasks/--input-mode, or
    --tf-data-service ADDRESS (input_mode 'tf_data_service'); {} when none is given."""
    if getattr(args, "tf_data_service", None):
        return {"input_mode": "tf_data_service", "tf_data_service": args.tf_data_service}
    if getattr(args, "input_job", None):
        return {"input_job": args.input_job, "input_tasks": args.input_tasks, "input_mode": args.input_mode}
    return {}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("smartstage")
    except Exception:
        return "(not installed)"


# -- terminal output ---------------------------------------------------------------------------------
def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 120, highlight=False, soft_wrap=not stderr)


@contextlib.contextmanager
def spinner(message: str):
    """A spinner on a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        yield
        return
    with _console(stderr=True).status(message):
        yield


def load_input(path: str, what: str = "graph"):
    from smartstage.graph.load import load_graph

    size = Path(path).stat().st_size if Path(path).is_file() else 0
    with spinner(f"loading {what} {path} ({size / 1e6:.1f} MB)"):
        return load_graph(path)


def source_of(loaded):
    return loaded.meta_graph_def if loaded.meta_graph_def is not None else loaded.graph_def


def parse_feed_values(specs: list[str]) -> tuple[list[str], dict]:
    """`--feed NAME[=VALUE]`: the fed nodes, and the values verify feeds in both runs (VALUE: JSON)."""
    import json

    names, values = [], {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        names.append(name)
        if not sep:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            raise CommandFailed(f"--feed {spec!r}: VALUE {text!r} is not a number or a JSON list; "
                                f"e.g. --feed {name}=0.5 or --feed {name}='[1, 2]'") from None
        values[name if ":" in name else name + ":0"] = value
    return names, values


def print_summary(result, out=None) -> None:
    from rich.table import Table

    console = _console()
    table = Table(title="SmartStage", title_justify="left")
    for column in ("stage", "kind", "moved", "pinned", "boundary tensors", "status"):
        table.add_column(column, justify="right" if column in ("moved", "pinned") else "left")
    for p in result.partitions:
        status = f"unchanged: {p.skipped}" if p.skipped else "rewritten"
        table.add_row(p.stage.name, p.stage.kind, str(len(p.moved) if not p.skipped else 0), str(len(p.pinned)),
                      f"{len(p.boundary_before)} -> {len(p.boundary_after) if not p.skipped else len(p.boundary_before)}",
                      status)
    if not result.partitions:
        table.add_row("(none)", "", "0", "0", "", "; ".join(result.notes) or "no stage")
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    passes = "; ".join(f"{r.name} {r.seconds * 1000:.0f} ms" for r in result.reports)
    console.print(f"{len(result.original_graph_def.node)} nodes in {result.seconds:.2f} s ({passes})")
    if out:
        console.print(f"wrote {out}")


def report_json(diff, result) -> str:
    import json

    document = diff.to_dict()
    document["passes"] = [{"name": r.name, "changed": r.changed, "seconds": round(r.seconds, 6),
                           "summary": list(r.summary)} for r in result.reports]
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


@contextlib.contextmanager
def progress_bar(steps: int):
    """A progress bar per run (before, after) on a terminal; a no-op callback otherwise."""
    if not sys.stderr.isatty():
        yield lambda phase, step: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=_console(stderr=True), transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(phase: str, step: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"{phase} steps", total=steps)
            bar.update(tasks[phase], completed=step)

        yield update
