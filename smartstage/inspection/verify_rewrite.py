"""verify_rewrite: run a graph before and after optimize() side by side and compare every fetched value.

    check = verify_rewrite("model.meta", steps=20)
    check.identical        # True when every fetch is bit-identical at every step
    check.describe()       # "identical: 20 step(s), 2 fetch(es) each" / "step 3: loss:0 differs: ..."

Fetches default to what the training step runs: the train_op, losses and smartstage_targets collections of
a MetaGraphDef. A fetch of a tensor that moved to the prefetch side is read through the take that now
carries it (OptimizeResult.fetch_map()), so both runs see the value of the batch being trained on.
A graph optimized with `input_job` (its stages on input tasks) runs, both before and after, on a loopback
cluster started for the check: `check.cluster` is its ClusterSpec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from smartstage.errors import ConfigError, TargetError
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.load import TARGET_COLLECTIONS, load_graph
from smartstage.inspection.loopback import START_SECONDS, TRAINER_JOB, LoopbackCluster
from smartstage.inspection.placement import stage_placements

if TYPE_CHECKING:  # replay imports TensorFlow: loaded when verify_rewrite runs
    from smartstage.inspection.replay import Comparison


@dataclass(frozen=True)
class RewriteCheck:
    """The comparison of the runs, and what was fetched in each graph."""

    comparison: Comparison
    fetches: tuple[str, ...]
    after_fetches: tuple[str, ...]
    result: object  # the OptimizeResult whose graph ran as "after"
    cluster: dict | None = None  # the loopback ClusterSpec both graphs ran on (None: in-process)
    placement: tuple = ()  # the after graph's stages placed on input tasks (inspection.placement)

    @property
    def identical(self) -> bool:
        return self.comparison.identical

    @property
    def steps(self) -> int:
        return len(self.comparison.before.values)

    def describe(self) -> str:
        where = ""
        if self.cluster is not None:
            inputs = [job for job in self.cluster if job != TRAINER_JOB]
            where = (f" on a loopback cluster (a trainer and {sum(len(self.cluster[j]) for j in inputs)} "
                     f"input task(s) of job {', '.join(inputs)})")
        text = self.comparison.describe() + where
        if not self.identical and any(p.mode == "sharded" for p in self.placement):
            text += ("; sharded sources form batches per task, so values differ from the unoptimized graph by "
                     "design (docs/scale-out.md): use input_mode='central' for identical values")
        return text


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


def verify_rewrite(graph, steps: int = 20, *, fetches: Sequence[str] | None = None, targets=None, feeds=None,
                   config=None, result=None, after=None, progress: Callable[[str, int], None] | None = None,
                   grappler: bool = False, cluster: bool | None = None,
                   start_seconds: float = START_SECONDS, **run_kwargs) -> RewriteCheck:
    """Optimizes `graph` (unless `result` is given) and compares `steps` steps of both graphs.

    after: the graph to run as "after" instead of the optimizer's (a test breaks one on purpose).
    progress: called with ("before" | "after", steps done so far).
    grappler: run both sessions with TensorFlow's Grappler on. Off by default: Grappler rewrites the main
      side differently once preprocessing arrives through the take (it folds and fuses across what is now
      the boundary), which changes float results in the last bit; the check is about SmartStage's rewrite.
    cluster: run both graphs on a loopback cluster (inspection/loopback.py: a trainer server and the input
      job's tasks, subprocesses on 127.0.0.1, killed afterwards). None (default): when the after graph has a
      stage placed on input tasks (optimized with input_job), whose devices an in-process session lacks.
      start_seconds bounds the servers' start.
    """
    from smartstage.inspection.replay import compare_runs
    from smartstage.config.options import enable_smart_stage
    from smartstage.optimizer import optimize

    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    loaded = load_graph(graph)
    source = loaded.meta_graph_def if loaded.meta_graph_def is not None else loaded.graph_def
    if result is None:
        # What is compared is fetched by the step: a target (an output of a take then keeps crossing the stage).
        fetched = [fetches] if isinstance(fetches, str) else list(fetches or ())
        listed = [targets] if isinstance(targets, str) or hasattr(targets, "graph") else list(targets or ())
        optimize_config = config if config is not None else enable_smart_stage()
        if not grappler and "config" not in run_kwargs:
            # Both graphs run as written (replay.as_written_config): the rewrite must not bake Grappler's
            # rewrites into what it folds into a dataset either.
            optimize_config = _copy(optimize_config)
            optimize_config.graph_options.rewrite_options.disable_meta_optimizer = True
        result = optimize(source, optimize_config, targets=listed + fetched, feeds=feeds)
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
    placement = stage_placements(after)
    if cluster is None:
        cluster = bool(placement)
    if not cluster:
        if placement:
            raise ConfigError(f"stage {placement[0].stage!r} runs on the tasks of job {placement[0].job!r}, which an "
                              "in-process session does not have; verify it on a loopback cluster (cluster=None)")
        comparison = compare_runs(source, after, names, steps, after_fetches=after_names, progress=report,
                                  **run_kwargs)
        return RewriteCheck(comparison, tuple(names), tuple(after_names), result)
    jobs = sorted({p.job for p in placement}) or ["input"]
    if len(jobs) > 1:
        raise ConfigError(f"the stages run on the tasks of {len(jobs)} jobs ({', '.join(jobs)}); the loopback "
                          "cluster has one input job: optimize with one input_job to verify")
    tasks = max((len(p.tasks) for p in placement), default=1)
    from smartstage.inspection.replay import as_written_config

    config = as_written_config() if run_kwargs.get("config") is None else _copy(run_kwargs["config"])
    config.isolate_session_state = True  # the two graphs share the servers, never their variables or queues
    run_kwargs["config"] = config
    with LoopbackCluster(jobs[0], tasks, start_seconds=start_seconds) as loopback:
        comparison = compare_runs(source, after, names, steps, after_fetches=after_names, progress=report,
                                  target=loopback.target, **run_kwargs)
        spec = dict(loopback.spec)
    return RewriteCheck(comparison, tuple(names), tuple(after_names), result, spec, placement)


def _copy(config):
    import tensorflow as tf

    copied = tf.compat.v1.ConfigProto()
    copied.CopyFrom(config)
    return copied


def _tensor(name: str) -> str:
    t = parse_tensor_name(name)
    return name if t.is_control else str(t)
