"""The commands `optimize`, `diff`, `explain` and `verify`: parsed arguments in, an exit code out.

    optimize_command(args)   # smartstage optimize model.meta -o fast.meta --html report.html
"""

from __future__ import annotations

import sys
from pathlib import Path

from smartstage.cli.common import (EXIT_DIFFERENT, EXIT_OK, CommandFailed, load_input, options_from_args,
                                   parse_feed_values, print_summary, progress_bar, report_json, scale_out_options,
                                   source_of, spinner)


# -- commands ----------------------------------------------------------------------------------------
def optimize_command(args) -> int:
    from smartstage.cli.outputs import CommandOutputs
    from smartstage.graph.load import graph_bytes
    from smartstage.optimizer import optimize

    src, out = Path(args.input), Path(args.output)
    if out.suffix != src.suffix:
        raise CommandFailed(f"OUT {args.output!r} must have the format of IN ({src.suffix or 'no extension'}): "
                            "the rewritten graph is written in the input's format; "
                            f"name it e.g. {out.with_suffix(src.suffix).name!r}")
    if out.resolve() == src.resolve():
        raise CommandFailed(f"OUT {args.output!r} is IN: write the rewritten graph to another file")
    loaded = load_input(args.input)
    with spinner("optimizing"):
        result = optimize(source_of(loaded), options_from_args(args, gpu=args.gpu), targets=args.target,
                          feeds=parse_feed_values(args.feed)[0], **scale_out_options(args))
    after = result.meta_graph_def if result.meta_graph_def is not None else result.graph_def
    # Every output is written beside its destination first, then all are renamed into place together:
    # a failure anywhere (a report that cannot be written, an interrupt) leaves no output behind.
    with CommandOutputs() as outputs:
        outputs.add(out, graph_bytes(after, out))
        if args.report or args.html:
            with spinner("comparing before and after"):
                diff = result.diff()
            if args.report:
                outputs.add(args.report, report_json(diff, result))
            if args.html:
                from smartstage.inspection.render.html import html_report

                outputs.add(args.html, html_report(diff, result, title=f"SmartStage report: {src.name}",
                                                   layout=args.layout, max_boxes=args.max_boxes))
        if args.tensorboard:
            from smartstage.inspection.render.tensorboard import write_tensorboard

            before = loaded.meta_graph_def if loaded.meta_graph_def is not None else result.original_graph_def
            outputs.add_tree(args.tensorboard, lambda folder: write_tensorboard(before, after, folder))
        written = outputs.paths
        outputs.commit()
    print_summary(result, out=", ".join(written))
    return EXIT_OK


def diff_command(args) -> int:
    from smartstage.inspection.diff import graph_diff
    from smartstage.inspection.render.json_report import json_report
    from smartstage.inspection.render.text import text_report

    before, after = load_input(args.before, "BEFORE"), load_input(args.after, "AFTER")
    with spinner("comparing"):
        diff = graph_diff(source_of(before), source_of(after))
    from smartstage.cli.outputs import CommandOutputs

    with CommandOutputs() as outputs:
        if args.html:
            from smartstage.inspection.render.html import html_report

            outputs.add(args.html, html_report(diff, title=f"SmartStage diff: {Path(args.before).name} -> "
                                               f"{Path(args.after).name}", layout=args.layout,
                                               max_boxes=args.max_boxes))
        if args.dot:
            from smartstage.inspection.render.dot import dot_source

            outputs.add(args.dot, dot_source(diff, args.max_boxes))
        if args.svg:
            from smartstage.inspection.render.svg import svg_drawing

            outputs.add(args.svg, svg_drawing(diff, args.max_boxes, layout=args.layout))
        outputs.commit()
    sys.stdout.write(json_report(diff) if args.json else text_report(diff, limit=None if args.all else 40))
    return EXIT_OK


def explain_command(args) -> int:
    import json

    from smartstage.inspection.explain import explain
    from smartstage.inspection.placement import placement_lines, stage_placements
    from smartstage.optimizer import optimize

    if not args.node and not args.placement:
        raise CommandFailed("explain needs NODE (why it moved or stayed), or --placement (which input task runs what)")
    loaded = load_input(args.graph)
    feeds = parse_feed_values(args.feed)[0]
    with spinner("optimizing"):
        result = optimize(source_of(loaded), options_from_args(args), targets=args.target, feeds=feeds)
        explanation = explain(source_of(loaded), args.node, result=result) if args.node else None
    placements = stage_placements(result.meta_graph_def if result.meta_graph_def is not None else result.graph_def)
    if args.json:
        document = explanation.to_dict() if explanation is not None else {}
        if args.placement:
            document["placements"] = [p.to_dict() for p in placements]
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return EXIT_OK
    if explanation is not None:
        sys.stdout.write(explanation.text() + "\n")
    if args.placement:
        lines = placement_lines(placements) or [
            f"no stage of {args.graph} is placed on input tasks (optimize it with --input-job JOB --input-tasks N, "
            "or pass them here)"]
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def verify_command(args) -> int:
    from smartstage.inspection.verify_rewrite import verify_rewrite

    loaded = load_input(args.graph)
    feeds, feed_dict = parse_feed_values(args.feed)
    with progress_bar(args.steps) as progress:
        check = verify_rewrite(source_of(loaded), args.steps, fetches=args.fetch or None, targets=args.target,
                               feeds=feeds, progress=progress, grappler=args.grappler, config=options_from_args(args),
                               feed_dict=feed_dict or None, start_seconds=args.start_timeout)
    fetched = ", ".join(check.fetches)
    if check.identical:
        print(f"verify: {check.describe()}; fetched {fetched}")
        return EXIT_OK
    print(f"verify: NOT identical: {check.describe()}; fetched {fetched}")
    return EXIT_DIFFERENT
