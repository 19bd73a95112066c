"""verify_rewrite: run a graph before and after optimize() side by side and compare every fetched value.

    check = verify_rewrite("model.meta", steps=20)
    check.identical        # True when every fetch is bit-identical at every step
    check.describe()       # "identical: 20 step(s), 2 fetch(es) each" / "step 3: loss:0 differs: ..."

Fetches default to what the training step runs: the train_op, losses and smartstage_targets collections of
a MetaGraphDef. A fetch of a tensor that moved to the prefetch side is read through the take that now
carries it (OptimizeResult.fetch_map()), so both runs see the value of the batch being trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from smartstage.errors import TargetError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.load import TARGET_COLLECTIONS, load_graph


@dataclass(frozen=True)
class RewriteCheck:
    """The comparison of the runs, and what was fetched in each graph."""

    comparison: object  # smartstage.compare.Comparison
    fetches: tuple[str, ...]
    after_fetches: tuple[str, ...]
    result: object  # the OptimizeResult whose graph ran as "after"

    @property
    def identical(self) -> bool:
        return self.comparison.identical

    @property
    def steps(self) -> int:
        return len(self.comparison.before.values)

    def describe(self) -> str:
        return self.comparison.describe()


def default_fetches(meta_graph_def) -> list[str]:
    """The train ops, losses and marked targets of a MetaGraphDef, in collection order."""
    if meta_graph_def is None:
        return []
    names: list[str] = []
    for key in TARGET_COLLECTIONS:
        if key in ("summaries",) or key not in meta_graph_def.collection_def:
            continue
        names.extend(meta_graph_def.collection_def[key].node_list.value)
    return list(dict.fromkeys(names))


def verify_rewrite(graph, steps: int = 10, *, fetches: Sequence[str] | None = None, targets=None, feeds=None,
                   config=None, result=None, after=None, progress: Callable[[str, int], None] | None = None,
                   grappler: bool = False, **run_kwargs) -> RewriteCheck:
    """Optimizes `graph` (unless `result` is given) and compares `steps` steps of both graphs.

    after: the graph to run as "after" instead of the optimizer's (a test breaks one on purpose).
    progress: called with ("before" | "after", steps done so far).
    grappler: run both sessions with TensorFlow's Grappler on. Off by default: Grappler rewrites the main
      side differently once preprocessing arrives through the take (it folds and fuses across what is now
      the boundary), which changes float results in the last bit; the check is about SmartStage's rewrite.
    """
    from smartstage.inspection.replay import compare_runs
    from smartstage.config.options import enable_smart_stage
    from smartstage.optimizer import optimize

    if steps < 1:
        from smartstage.errors import ConfigError

        raise ConfigError(f"steps must be at least 1, got {steps}")
    loaded = load_graph(graph)
    source = loaded.meta_graph_def if loaded.meta_graph_def is not None else loaded.graph_def
    if result is None:
        # What is compared is fetched by the step: a target (an output of a take then keeps crossing the stage).
        fetched = [fetches] if isinstance(fetches, str) else list(fetches or ())
        listed = [targets] if isinstance(targets, str) or hasattr(targets, "graph") else list(targets or ())
        result = optimize(source, config if config is not None else enable_smart_stage(),
                          targets=listed + fetched, feeds=feeds)
    names = list(fetches) if fetches else default_fetches(loaded.meta_graph_def)
    if not names:
        raise TargetError("nothing to compare: the graph has no train_op, losses or smartstage_targets collection "
                          "(a bare GraphDef has none); name the tensors or ops to fetch with --fetch NAME")
    mapping = result.fetch_map()
    after_names = [mapping.get(_tensor(n), n) for n in names]
    if after is None:
        after = result.meta_graph_def if result.meta_graph_def is not None else result.graph_def

    calls = {"n": 0}

    def report(step: int) -> None:
        if step == 1:
            calls["n"] += 1
        if progress is not None:
            progress("before" if calls["n"] <= 1 else "after", step)

    if grappler and "config" not in run_kwargs:
        import tensorflow as tf

        run_kwargs["config"] = tf.compat.v1.ConfigProto()  # TensorFlow's defaults, Grappler on
    comparison = compare_runs(source, after, names, steps, after_fetches=after_names, progress=report, **run_kwargs)
    return RewriteCheck(comparison, tuple(names), tuple(after_names), result)


def _tensor(name: str) -> str:
    t = parse_tensor_name(name)
    return name if t.is_control else str(t)
