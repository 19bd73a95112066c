"""The `smartstage` command: optimize, diff, explain, verify, demo.

    smartstage demo                                   # optimize a built-in example graph, show the diff
    smartstage optimize model.meta -o fast.meta --html report.html --report report.json
    smartstage diff model.meta fast.meta [--json]
    smartstage explain model.meta dlrm/embeddings/C1/lookup
    smartstage verify model.meta --steps 20          # exit 1 when any fetched value differs
    smartstage explain model.meta --placement --input-job input --input-tasks 2   # which input task runs what

Exit codes: 0 done; 1 `verify` found a difference; 2 bad input or a SmartStage error (one line on
stderr, no traceback; wrong flags get argparse's usage message); 130 interrupted. Progress (loading,
verify steps) shows on a terminal only.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from smartstage.cli.commands import diff_command, explain_command, optimize_command, verify_command
from smartstage.cli.common import (EXIT_ERROR, EXIT_INTERRUPTED, CommandFailed, package_version, positive_int,
                                   print_error)
from smartstage.cli.demo import demo_command


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line `argv` (default: sys.argv[1:]) and returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    _quiet_tensorflow()
    from smartstage.cli.messages import no_stage_message, op_error_message
    from smartstage.errors import NoStageError, SmartStageError

    try:
        return args.run(args)
    except NoStageError as e:
        print_error(no_stage_message(e, bool(getattr(args, "auto_stage", False))))
    except (SmartStageError, CommandFailed) as e:
        print_error(str(e))
    except OSError as e:  # the path the user gave (outputs never report their temporary files)
        print_error(f"{e.filename}: {e.strerror or e}" if getattr(e, "filename", None) else str(e))
    except KeyboardInterrupt:
        print("smartstage: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # TensorFlow errors while running a graph (verify, demo)
        import tensorflow as tf

        if not isinstance(e, tf.errors.OpError):
            raise
        print_error(op_error_message(e))
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smartstage", description="Move input preprocessing of a TensorFlow "
                                     "training graph behind a prefetching stage, and inspect what moved.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("optimize", help="rewrite a graph file (.pb, .pbtxt, .meta) and report what moved")
    p.add_argument("input", metavar="IN", help="the graph file to optimize")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="where to write the rewritten graph "
                   "(same format as IN; written atomically)")
    _selection_flags(p)
    p.add_argument("--gpu", action="store_true", help="also place the prefetch side for a GPU (do_smart_stage_gpu)")
    _scale_out_flags(p)
    p.add_argument("--report", metavar="JSON", help="write the GraphDiff as JSON (docs/graph-diff-json.md)")
    p.add_argument("--html", metavar="HTML", help="write the self-contained HTML report")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="write the graph before and after as two TensorBoard runs")
    _layout_flags(p)
    p.set_defaults(run=optimize_command)

    p = sub.add_parser("diff", help="what changed between any two graphs")
    p.add_argument("before", metavar="BEFORE")
    p.add_argument("after", metavar="AFTER")
    p.add_argument("--json", action="store_true", help="print the JSON form instead of text")
    p.add_argument("--all", action="store_true", help="list every entry (text lists stop at 40)")
    p.add_argument("--html", metavar="HTML", help="also write the HTML report")
    p.add_argument("--dot", metavar="DOT", help="also write the drawing as Graphviz source")
    p.add_argument("--svg", metavar="SVG", help="also write the drawing as SVG")
    _layout_flags(p)
    p.set_defaults(run=diff_command)

    p = sub.add_parser("explain", help="why a node stays on the main side, or why it moves")
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("node", metavar="NODE", nargs="?", help="the node to explain (optional with --placement)")
    _selection_flags(p)
    _scale_out_flags(p)
    p.add_argument("--placement", action="store_true", help="print which input task runs what, per stage (a graph "
                   "optimized with --input-job, or pass --input-job here)")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.set_defaults(run=explain_command)

    p = sub.add_parser("verify", help="run the graph before and after optimizing; compare every fetched value")
    p.add_argument("graph", metavar="GRAPH")
    p.add_argument("--steps", type=positive_int, default=20, help="steps to run each graph (default 20)")
    p.add_argument("--fetch", action="append", default=[], metavar="NAME",
                   help="a tensor or op to fetch and compare (repeatable; default: the train_op, losses and "
                        "smartstage_targets collections)")
    p.add_argument("--grappler", action="store_true", help="keep TensorFlow's Grappler on in both runs (it may "
                   "fold the main side differently after the rewrite: last-bit float differences)")
    _selection_flags(p, feeds_values=True)
    _scale_out_flags(p, " (verify then runs both graphs on a loopback cluster: a trainer and N input-task "
                        "servers on 127.0.0.1)")
    p.add_argument("--start-timeout", type=positive_int, default=60, metavar="SECONDS",
                   help="how long the loopback cluster's servers may take to start (default 60)")
    p.set_defaults(run=verify_command)

    p = sub.add_parser("demo", help="optimize a built-in example graph and show the diff")
    p.add_argument("--out", metavar="DIR", help="keep the example's data, before.meta, after.meta, report.html "
                   "and report.json in DIR")
    p.add_argument("--json", action="store_true", help="print the diff as JSON instead of text")
    p.add_argument("--verify", type=positive_int, metavar="STEPS", help="also run both graphs STEPS steps and compare")
    p.add_argument("--train", nargs="?", const=3.0, type=float, metavar="SECONDS", help="also train the DLRM-like "
                   "example flag off and on, on the CPU and on an emulated accelerator: steps/s, losses, verdict")
    _layout_flags(p)
    p.set_defaults(run=demo_command)
    return parser


def _selection_flags(p: argparse.ArgumentParser, feeds_values: bool = False) -> None:
    """--target, --feed and --auto-stage; only verify runs the graph, so only verify's --feed takes a VALUE."""
    p.add_argument("--target", action="append", default=[], metavar="NAME",
                   help="a node the training step fetches (stays on the main side; repeatable)")
    feed_help = "a node the training step feeds (stays on the main side; repeatable)"
    if feeds_values:
        feed_help += "; VALUE (JSON: a number or a list) is fed to it in both runs"
    p.add_argument("--feed", action="append", default=[], metavar="NAME[=VALUE]" if feeds_values else "NAME",
                   help=feed_help)
    p.add_argument("--auto-stage", action="store_true",
                   help="insert a stage at every input source (iterator, queue dequeue, reader) no stage covers")


def _scale_out_flags(p: argparse.ArgumentParser, more: str = "") -> None:
    p.add_argument("--input-job", metavar="JOB", help="place the prefetch side on the tasks of JOB "
                   f"(/job:JOB/task:i; docs/scale-out.md){more}")
    p.add_argument("--input-tasks", type=positive_int, default=1, metavar="N", help="tasks of --input-job (default 1)")
    p.add_argument("--input-mode", choices=("central", "sharded"), default="central",
                   help="central: the trainer reads, the tasks compute; sharded: task i reads shard i")
    p.add_argument("--tf-data-service", "--tfdata-service", dest="tf_data_service", metavar="grpc://HOST:PORT",
                   action=_RenamedFlag,
                   help="fold the stateless prefetch side into the tf.data pipeline and run it on this tf.data "
                        "service dispatcher's workers (opt-in: batches and order change; docs/scale-out.md); "
                        "--tfdata-service is its old spelling")


class _RenamedFlag(argparse.Action):
    """A flag whose second option string is its old spelling: that one works and warns (FutureWarning)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == self.option_strings[-1] and len(self.option_strings) > 1:
            from smartstage.config.renamed import warn_renamed

            warn_renamed("smartstage", option_string, self.option_strings[0], stacklevel=1)
        setattr(namespace, self.dest, values)


def _layout_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", choices=("builtin", "graphviz", "auto"), default="builtin",
                   help="how the drawing is laid out: built-in (default), Graphviz dot, or dot when installed")
    p.add_argument("--max-boxes", type=positive_int, default=80, help="boxes in the drawing before scopes collapse")


if __name__ == "__main__":
    sys.exit(main())
