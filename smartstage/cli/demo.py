"""`smartstage demo`: a built-in staged example graph, optimized and shown (moves, pins, the diff).

    smartstage demo --out demo/        # also keeps before.meta, after.meta, report.html, report.json
    smartstage demo --train            # also trains the example flag off and on: steps/s, losses, verdict
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from smartstage.cli.common import EXIT_DIFFERENT, EXIT_OK, print_summary, progress_bar, report_json, spinner

DEMO_LIST_LIMIT, DEMO_PINNED_LIMIT = 20, 6  # the demo's text: every move, a taste of the pins


def demo_command(args) -> int:
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

    with spinner("building the demo graph"):
        before = demo_graph(workdir)
        result = optimize(before, enable_smart_stage())
        diff = result.diff()
    if args.out:
        from smartstage.cli.outputs import CommandOutputs
        from smartstage.graph.load import graph_bytes
        from smartstage.inspection.render.html import html_report

        with CommandOutputs() as outputs:  # the four files together, or none
            for path, graph in ((workdir / "before.meta", before), (workdir / "after.meta", result.meta_graph_def)):
                outputs.add(path, graph_bytes(graph, path))
            outputs.add(workdir / "report.json", report_json(diff, result))
            outputs.add(workdir / "report.html", html_report(diff, result, title="SmartStage demo",
                                                             layout=args.layout, max_boxes=args.max_boxes))
            outputs.commit()
    sys.stdout.write(json_report(diff) if args.json else text_report(diff, limit=DEMO_LIST_LIMIT, pinned_limit=DEMO_PINNED_LIMIT))
    if not args.json:
        print()
        print_summary(result, out=str(workdir) if args.out else None)
    if args.verify:
        from smartstage.inspection.verify_rewrite import verify_rewrite

        with progress_bar(args.verify) as progress:
            check = verify_rewrite(before, args.verify, result=result, progress=progress)
        print(f"verify: {check.describe()}" if check.identical else f"verify: NOT identical: {check.describe()}",
              file=sys.stderr if args.json else sys.stdout)
        if not check.identical:
            return EXIT_DIFFERENT
    if args.out and not args.json:
        print(f"try: smartstage explain {workdir / 'before.meta'} preprocess/hash_C1")
    if getattr(args, "train", None):
        from smartstage.cli.demo_train import train_demo, train_text

        print()
        with spinner(f"training the example flag off and on, {args.train:g} s a run"):
            comparisons = train_demo(workdir, args.train)
        text = train_text(comparisons, args.train)
        if args.json:
            sys.stderr.write(text)
        else:
            sys.stdout.write(text)
        if not all(c.identical for c in comparisons):
            return EXIT_DIFFERENT
    return EXIT_OK
