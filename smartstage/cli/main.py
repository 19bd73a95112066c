"""The `smartstage` command: optimize, diff, explain, verify, demo.

    smartstage demo                                   # optimize a built-in example graph, show the diff
    smartstage optimize model.meta -o fast.meta --html report.html --report report.json
    smartstage diff model.meta fast.meta [--json]
    smartstage explain model.meta dlrm/embeddings/C1/lookup
    smartstage verify model.meta --steps 20          # exit 1 when any fetched value differs

Exit codes: 0 done; 1 `verify` found a difference; 2 bad input or a SmartStage error (one line on
stderr, no traceback; wrong flags get argparse's usage message); 130 interrupted. Progress (loading,
verify steps) shows on a terminal only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
DEMO_LIST_LIMIT, DEMO_PINNED_LIMIT = 20, 6  # the demo's text: every move, a taste of the pins


class _Fail(Exception):
    """A one-line error from the CLI itself (bad paths and flags found after parsing)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line `argv` (default: sys.argv[1:]) and returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    _quiet_tensorflow()
    from smartstage.errors import SmartStageError

    try:
        return args.run(args)
    except (SmartStageError, _Fail) as e:
        _error(str(e))
    except OSError as e:
        _error(f"{e.strerror or e}: {e.filename}" if getattr(e, "filename", None) else str(e))
    except KeyboardInterrupt:
        print("smartstage: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # TensorFlow errors while running a graph (verify, demo)
        import tensorflow as tf

        if not isinstance(e, tf.errors.OpError):
            raise
        first = (e.message or str(e)).strip().splitlines()[0]
        _error(f"the graph failed to run ({type(e).__name__}): {first}")
    return EXIT_ERROR


def _quiet_tensorflow() -> None:
    """TensorFlow's start-up chatter (CUDA probes, absl banners) is not ours to print on a user's stderr."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            sys.stderr.flush()
            os.dup2(devnull, 2)
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


def _error(message: str) -> None:
    message = " ".join(message.split())  # one line, whatever the message held
    print(f"smartstage: error: {message}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smartstage", description="Move input preprocessing of a TensorFlow "
                                     "training graph behind a prefetching stage, and inspect what moved.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("optimize", help="rewrite a graph file (.pb, .pbtxt, .meta) and report what moved")
    p.add_argument("input", metavar="IN", help="the graph file to optimize")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="where to write the rewritten graph "
                   "(same format as IN; written atomically)")
    _selection_flags(p)
    p.add_argument("--gpu", action="store_true", help="also place the prefetch side for a GPU (do_smart_stage_gpu)")
    p.add_argument("--report", metavar="JSON", help="write the GraphDiff as JSON (docs/graph-diff-json.md)")
    p.add_argument("--html", metavar="HTML", help="write the self-contained HTML report")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="write the graph before and after as two TensorBoard runs")
    _layout_flags(p)
    p.set_defaults(run=_optimize)

    p = sub.add_parser("diff", help="what changed between any two graphs")
    p.add_argument("before", metavar="BEFORE")
    p.add_argument("after", metavar="AFTER")
    p.add_argument("--json", action="store_true", help="print the JSON form instead of text")
    p.add_argument("--all", action="store_true", help="list every entry (text lists stop at 40)")
    p.add_argument("--html", metavar="HTML", help="also write the HTML report")
    p.add_argument("--dot", metavar="DOT", help="also write the drawing as Graphviz source")
    p.add_argument("--svg", metavar="SVG", help="also write the drawing as SVG")
    _layout_flags(p)
    p.set_defaults(run=_diff)

    p = sub.add_parser("explain", help="why a node stays on the main side, or why it moves")
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("node", metavar="NODE")
    _selection_flags(p)
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.set_defaults(run=_explain)

    p = sub.add_parser("verify", help="run the graph before and after optimizing; compare every fetched value")
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("--steps", type=_positive, default=10, help="steps to run each graph (default 10)")
    p.add_argument("--fetch", action="append", default=[], metavar="NAME",
                   help="a tensor or op to fetch and compare (repeatable; default: the train_op, losses and "
                        "smartstage_targets collections)")
    p.add_argument("--grappler", action="store_true", help="keep TensorFlow's Grappler on in both runs (it may "
                   "fold the main side differently after the rewrite: last-bit float differences)")
    _selection_flags(p)
    p.set_defaults(run=_verify)

    p = sub.add_parser("demo", help="optimize a built-in example graph and show the diff")
    p.add_argument("--out", metavar="DIR", help="keep the example's data, before.meta, after.meta, report.html "
                   "and report.json in DIR")
    p.add_argument("--json", action="store_true", help="print the diff as JSON instead of text")
    p.add_argument("--verify", type=_positive, metavar="STEPS", help="also run both graphs STEPS steps and compare")
    _layout_flags(p)
    p.set_defaults(run=_demo)
    return parser


def _selection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", default=[], metavar="NAME",
                   help="a node the training step fetches (stays on the main side; repeatable)")
    p.add_argument("--feed", action="append", default=[], metavar="NAME",
                   help="a node the training step feeds (repeatable)")
    p.add_argument("--auto-stage", action="store_true",
                   help="insert a stage at every input source (iterator, queue dequeue, reader) no stage covers")


def _config(args, gpu: bool = False):
    from smartstage.config.options import enable_smart_stage

    return enable_smart_stage(gpu=gpu, auto_stage=True if args.auto_stage else None)


def _layout_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", choices=("builtin", "graphviz", "auto"), default="builtin",
                   help="how the drawing is laid out: built-in (default), Graphviz dot, or dot when installed")
    p.add_argument("--max-boxes", type=_positive, default=80, help="boxes in the drawing before scopes collapse")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _version() -> str:
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
def _status(message: str):
    """A spinner on a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        yield
        return
    with _console(stderr=True).status(message):
        yield


def _load(path: str, what: str = "graph"):
    from smartstage.graph.load import load_graph

    size = Path(path).stat().st_size if Path(path).is_file() else 0
    with _status(f"loading {what} {path} ({size / 1e6:.1f} MB)"):
        return load_graph(path)


def _source(loaded):
    return loaded.meta_graph_def if loaded.meta_graph_def is not None else loaded.graph_def


def _write_text(path: str, text: str) -> None:
    """Writes text atomically: a temporary file in the same folder, renamed over `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + target.name + ".", dir=str(target.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _print_summary(result, out=None) -> None:
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


# -- commands ----------------------------------------------------------------------------------------
def _optimize(args) -> int:
    from smartstage.graph.load import write_graph
    from smartstage.optimizer import optimize

    src, out = Path(args.input), Path(args.output)
    if out.suffix != src.suffix:
        raise _Fail(f"OUT {args.output!r} must have the format of IN ({src.suffix or 'no extension'}): the rewritten "
                    f"graph is written in the input's format; name it e.g. {out.with_suffix(src.suffix).name!r}")
    if out.resolve() == src.resolve():
        raise _Fail(f"OUT {args.output!r} is IN: write the rewritten graph to another file")
    loaded = _load(args.input)
    with _status("optimizing"):
        result = optimize(_source(loaded), _config(args, gpu=args.gpu), targets=args.target, feeds=args.feed)
    # Everything is computed before anything is written: a failure leaves no output behind.
    outputs: list[tuple[str, str]] = []
    if args.report or args.html:
        with _status("comparing before and after"):
            diff = result.diff()
        if args.report:
            outputs.append((args.report, _report_json(diff, result)))
        if args.html:
            from smartstage.inspection.render.html import html_report

            outputs.append((args.html, html_report(diff, result, title=f"SmartStage report: {src.name}",
                                                   layout=args.layout, max_boxes=args.max_boxes)))
    write_graph(result.meta_graph_def if result.meta_graph_def is not None else result.graph_def, out)
    for path, text in outputs:
        _write_text(path, text)
    if args.tensorboard:
        from smartstage.inspection.render.tensorboard import write_tensorboard

        meta_before = loaded.meta_graph_def
        write_tensorboard(meta_before if meta_before is not None else result.original_graph_def,
                          result.meta_graph_def if result.meta_graph_def is not None else result.graph_def,
                          args.tensorboard)
    _print_summary(result, out=", ".join([str(out)] + [p for p, _ in outputs]
                                         + ([args.tensorboard] if args.tensorboard else [])))
    return EXIT_OK


def _report_json(diff, result) -> str:
    import json

    document = diff.to_dict()
    document["passes"] = [{"name": r.name, "changed": r.changed, "seconds": round(r.seconds, 6),
                           "summary": list(r.summary)} for r in result.reports]
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _diff(args) -> int:
    from smartstage.inspection.diff import graph_diff
    from smartstage.inspection.render.json_report import json_report
    from smartstage.inspection.render.text import text_report

    before, after = _load(args.before, "BEFORE"), _load(args.after, "AFTER")
    with _status("comparing"):
        diff = graph_diff(_source(before), _source(after))
    outputs = []
    if args.html:
        from smartstage.inspection.render.html import html_report

        outputs.append((args.html, html_report(diff, title=f"SmartStage diff: {Path(args.before).name} -> "
                                               f"{Path(args.after).name}", layout=args.layout,
                                               max_boxes=args.max_boxes)))
    if args.dot:
        from smartstage.inspection.render.dot import dot_source

        outputs.append((args.dot, dot_source(diff, args.max_boxes)))
    if args.svg:
        from smartstage.inspection.render.svg import svg_drawing

        outputs.append((args.svg, svg_drawing(diff, args.max_boxes, layout=args.layout)))
    for path, text in outputs:
        _write_text(path, text)
    sys.stdout.write(json_report(diff) if args.json else text_report(diff, limit=None if args.all else 40))
    return EXIT_OK


def _explain(args) -> int:
    import json

    from smartstage.inspection.explain import explain

    loaded = _load(args.graph)
    with _status("optimizing"):
        explanation = explain(_source(loaded), args.node, targets=args.target, feeds=args.feed,
                              config=_config(args))
    if args.json:
        sys.stdout.write(json.dumps(explanation.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(explanation.text() + "\n")
    return EXIT_OK


def _verify(args) -> int:
    from smartstage.inspection.verify_rewrite import verify_rewrite

    loaded = _load(args.graph)
    with _progress(args.steps) as progress:
        check = verify_rewrite(_source(loaded), args.steps, fetches=args.fetch or None, targets=args.target,
                               feeds=args.feed, progress=progress, grappler=args.grappler, config=_config(args))
    fetched = ", ".join(check.fetches)
    if check.identical:
        print(f"verify: {check.describe()}; fetched {fetched}")
        return EXIT_OK
    print(f"verify: NOT identical: {check.describe()}; fetched {fetched}")
    return EXIT_DIFFERENT


@contextlib.contextmanager
def _progress(steps: int):
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


def _demo(args) -> int:
    """Builds smartstage.examples' demo graph on a small synthetic CSV, optimizes it, prints the diff."""
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return _run_demo(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="smartstage-demo-") as tmp:
        return _run_demo(args, Path(tmp))


def demo_graph(workdir) -> object:
    """The demo's MetaGraphDef: smartstage.examples.build_demo behind ss.staged(), reading a CSV in `workdir`."""
    import tensorflow as tf

    from smartstage.examples import build_demo, export_meta_graph_def, write_criteo_csv
    from smartstage.runtime import staged

    data = write_criteo_csv(Path(workdir) / "demo.csv", 64, seed=0)
    graph = tf.Graph()
    with graph.as_default():
        build_demo(data, stage_fn=staged)
        return export_meta_graph_def(graph)


def _run_demo(args, workdir: Path) -> int:
    from smartstage.config.options import enable_smart_stage
    from smartstage.optimizer import optimize
    from smartstage.inspection.render.json_report import json_report
    from smartstage.inspection.render.text import text_report

    with _status("building the demo graph"):
        before = demo_graph(workdir)
        result = optimize(before, enable_smart_stage())
        diff = result.diff()
    if args.out:
        from smartstage.graph.load import write_graph
        from smartstage.inspection.render.html import html_report

        write_graph(before, workdir / "before.meta")
        write_graph(result.meta_graph_def, workdir / "after.meta")
        _write_text(str(workdir / "report.json"), _report_json(diff, result))
        _write_text(str(workdir / "report.html"), html_report(diff, result, title="SmartStage demo",
                                                              layout=args.layout, max_boxes=args.max_boxes))
    sys.stdout.write(json_report(diff) if args.json else text_report(diff, limit=DEMO_LIST_LIMIT, pinned_limit=DEMO_PINNED_LIMIT))
    if not args.json:
        print()
        _print_summary(result, out=str(workdir) if args.out else None)
    if args.verify:
        from smartstage.inspection.verify_rewrite import verify_rewrite

        with _progress(args.verify) as progress:
            check = verify_rewrite(before, args.verify, result=result, progress=progress)
        print(f"verify: {check.describe()}" if check.identical else f"verify: NOT identical: {check.describe()}",
              file=sys.stderr if args.json else sys.stdout)
        if not check.identical:
            return EXIT_DIFFERENT
    if args.out and not args.json:
        print(f"try: smartstage explain {workdir / 'before.meta'} preprocess/hash_C1")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
