"""split(): a TF2 `tf.function` training step and its dataset, split so the input preprocessing runs in the
dataset (a deterministic parallel map, then prefetch) and the step keeps the rest, on the same variables.

    before:  for batch in ds:  train_step(batch)
    after:   split = ss.tf2.split(train_step, ds)
             for batch in split.dataset:  split.step(batch)        # or: ds2, step2 = split
             print(split.summary())                                 # moved, pinned with reasons, boundary

The partition is the v1 one, at the step's inputs (smartstage.tf2.step.analysis), the two sides are cut by edit
records (smartstage.graph.rewrites) and built into functions (smartstage.tf2.step.functions). Nothing of the user's is
changed: the step and dataset are as given, and split() raises SplitError before building anything.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import tensorflow as tf

from smartstage.config.renamed import SPLIT_RENAMES, renamed_arguments
from smartstage.errors import NothingToMoveError, SplitError
from smartstage.tf2.step.analysis import Analysis, analyse
from smartstage.tf2.step.functions import main_function, mapped_dataset, prefetch_function
from smartstage.tf2.step.state import static_tables, step_roots
from smartstage.graph.rewrites import Sides, cut
from smartstage.tf2.step.trace import TracedStep, trace_step
from smartstage.tf2.step.trial import time_split

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitStep:
    """A split step: `dataset` yields the boundary tensors of each batch (those of one dtype and static shape
    packed into one tensor where that pays), in input order; `step(batch)` runs the main side on them and
    returns what the user's step returned. Unpacks as `ds2, step2 = split`."""

    dataset: tf.data.Dataset
    step: Callable
    traced: TracedStep
    analysis: Analysis
    sides: Sides
    deterministic: bool = True
    tf_data_service: str | None = None  # the dispatcher the dataset runs on (smartstage.tf2.step.service)
    num_threads: int = tf.data.AUTOTUNE  # the map's threads (its num_parallel_calls)
    main_function: Any = field(default=None, repr=False)  # the tf.function behind `step`
    prefetch_function: Callable | None = field(default=None, repr=False)  # the map function
    trial: Any = None  # with split(measure=True): the timed Verdict (smartstage.tf2.step.trial)

    def __iter__(self):
        return iter((self.dataset, self.step))

    @property
    def result(self):
        """The OptimizeResult of the step's analysis graph (smartstage.tf2.step.analysis)."""
        return self.analysis.result

    @property
    def moved(self) -> tuple[str, ...]:
        return self.analysis.partition.moved

    @property
    def pinned(self) -> dict:
        return dict(self.analysis.partition.pinned)

    @property
    def boundary(self) -> tuple[str, ...]:
        """The tensors each dataset element carries, in order (names in the step's function graph)."""
        return self.sides.boundary

    def summary(self) -> str:
        """What moved, what stayed and why, what crosses, what each capture is, and how the dataset runs."""
        lines = [f"TF2 step {getattr(self.traced.function, '__name__', 'step')!r}, partitioned at its inputs",
                 self.result.summary()]
        if self.analysis.states:
            lines.append("captured state:")
            lines.extend(f"  {s.kind} {s.name!r} ({'may move' if s.movable else 'pinned'}: {s.reason})"
                         for s in self.analysis.states)
        order = "deterministic=True" if self.deterministic else "deterministic=False (batches may arrive out of order)"
        packing = getattr(self.prefetch_function, "packing", None)
        width = len(self.boundary) if packing is None else packing.width
        packed = "" if width == len(self.boundary) else (
            f" ({len(self.boundary)} boundary tensor(s), {sum(len(g) for g in packing.groups)} of them packed into "
            f"{len(packing.groups)} by dtype)")
        threads = "AUTOTUNE" if self.num_threads == tf.data.AUTOTUNE else self.num_threads
        lines.append(f"dataset: map(prefetch side, num_parallel_calls={threads}, {order}).prefetch(AUTOTUNE), "
                     f"{width} tensor(s) per element{packed}")
        if self.tf_data_service:
            from smartstage.tf2.step.service import service_line

            lines.append(service_line(self.tf_data_service))
        if self.trial is not None:
            lines.append(f"timed: {self.trial.text()}")
        return "\n".join(lines)

    def diff(self):
        """The GraphDiff of the analysis graph before and after (renderers: smartstage.inspection.render)."""
        return self.result.diff()

    def explain(self, node: str):
        """Why `node` of the step's graph moved or stayed (an Explanation; .text() for the sentence)."""
        from smartstage.inspection.explain import explain

        return explain(self.analysis.graph_def, node, result=self.result)

    def html(self) -> str:
        """The self-contained HTML report of the split (the v1 report of the analysis graph)."""
        from smartstage.inspection.render import html_report

        return html_report(self.diff(), self.result)


def _check_dataset(dataset) -> None:
    if not isinstance(dataset, tf.data.Dataset):
        raise SplitError(f"split(): dataset is a {type(dataset).__name__}, not a tf.data.Dataset; pass the dataset "
                         "the step's loop iterates (tf.data.Dataset.from_tensor_slices(...) for arrays)")


def split(step, dataset, *, deterministic: bool = True, read_only: bool = True, jit_compile: bool | None = None,
          num_threads: int = tf.data.AUTOTUNE, state=(), check_retrace: bool = True,
          tf_data_service: str | None = None, measure: bool = False, **renamed) -> SplitStep:
    """Splits a `tf.function` step: preprocessing into `dataset.map`, the rest into a new step.

    step: the @tf.function the loop calls as step(batch) or step(*batch). dataset: what the loop iterates.
    deterministic: batches reach the step in input order (False is an explicit opt-out: faster, unordered).
    read_only: variables that are not trainable and only read by the step may move (module state.py).
    jit_compile: for the main side (default: the step's own). num_threads: the threads of the dataset's map
    (its num_parallel_calls; AUTOTUNE: tf.data picks). state: objects holding the step's tables when
    its closure does not reach them (a model, a module). check_retrace: trace twice to catch Python state.
    tf_data_service: a dispatcher address ("grpc://host:port"): the dataset, moved part included, runs on
    tf.data service workers (at most once, no fixed order across workers: smartstage.tf2.step.service).
    measure: time the split loop against the step's own on copies of its state (smartstage.tf2.step.trial, a few
    seconds) and raise NothingToMoveError when the split runs slower; the verdict is in `.trial`.
    renamed: `tfdata_service=` and `num_parallel_calls=`, the old spellings of tf_data_service= and
    num_threads= (a FutureWarning).

        before:  for batch in ds: train_step(batch)
        after:   ds2, step2 = ss.tf2.split(train_step, ds);  for batch in ds2: step2(batch)
    """
    if renamed:
        num_threads, tf_data_service = renamed_arguments(
            "split()", renamed, {"num_threads": num_threads, "tf_data_service": tf_data_service},
            {"num_threads": tf.data.AUTOTUNE, "tf_data_service": None}, SPLIT_RENAMES,
            hint="see help(smartstage.tf2.split)").values()
    _check_dataset(dataset)
    if tf_data_service is not None:
        from smartstage.tf2.step.service import check_address

        tf_data_service = check_address(tf_data_service)
    traced = trace_step(step, dataset.element_spec, check_retrace=check_retrace)
    tables = static_tables(step_roots(step) + list(state))
    analysis = analyse(traced, tables, read_only)
    partition = analysis.partition
    if not partition.changes_graph:
        why = partition.skipped or "no op depends on the batch alone"
        raise NothingToMoveError(f"split(): nothing in {getattr(step, '__name__', 'the step')!r} can move to the "
                                 f"input pipeline ({why}); the step and dataset are fine as they are: iterate the "
                                 "dataset with .prefetch(tf.data.AUTOTUNE)", reason=why)
    graph = traced.concrete.graph
    shapes = {t: graph.get_tensor_by_name(t).shape.as_proto() for t in partition.boundary_after}
    sides = cut(traced.graph_def, partition.moved, traced.inputs, tuple(partition.boundary_after), shapes)
    prefetch_fn = prefetch_function(sides, traced)
    main_fn = main_function(sides, traced, traced.jit_compile if jit_compile is None else jit_compile,
                            prefetch_fn.packing)
    new_dataset = mapped_dataset(dataset, prefetch_fn, deterministic=deterministic,
                                 num_threads=num_threads, tf_data_service=tf_data_service)

    # The concrete function, called directly: a tf.function with an input_signature binds and checks its
    # arguments in Python on every call, which cost more than the main side of a small step (about 2x here).
    main_concrete = main_fn.get_concrete_function()

    def split_step(*batch):
        return main_concrete(*tf.nest.flatten(batch))

    split_step.__name__ = getattr(step, "__name__", "step")
    logger.info("split %s: %d op(s) moved, %d boundary tensor(s)", split_step.__name__, len(partition.moved),
                len(sides.boundary))
    result = SplitStep(dataset=new_dataset, step=split_step, traced=traced, analysis=analysis, sides=sides,
                       deterministic=deterministic, tf_data_service=tf_data_service, num_threads=num_threads,
                       main_function=main_fn,
                       prefetch_function=prefetch_fn)
    if measure and tf_data_service is None:
        verdict = time_split(result, dataset)
        if not verdict.pays:
            raise NothingToMoveError(f"split(): splitting {split_step.__name__!r} does not pay: {verdict.text()}; "
                                     "the step and dataset are faster as they are: iterate the dataset with "
                                     ".prefetch(tf.data.AUTOTUNE)", reason=f"measured: {verdict.text()}")
        result = dataclasses.replace(result, trial=verdict)
    return result


__all__ = ["SplitStep", "split"]
