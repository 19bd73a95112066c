"""trial: whether a split runs faster than the step it came from, timed so that deciding trains nothing and
changes no value the user's program computes.

    before:  halves = split(step, ds)                       # split whether or not the map pays for itself
    after:   verdict = time_split(halves, ds);  verdict.pays   # False at 0.78x: keep the step as it is

A split pays when the input pipeline's spare cores absorb the moved work. When they do not (the dataset's own
parsing already keeps the cores busy, or the moved work is a few lookups against a map function call and its
thread hand-offs per batch), the split program runs slower than the unsplit one, and only running both tells.
Both programs run interleaved rounds of the same number of steps on fresh iterators of the user's dataset;
the verdict is the median of the per-round ratios (split steps/s over unsplit steps/s). A model compiled with
`steps_per_execution=N` is timed as fit runs it: N steps per call of one tf.function (`steps_per_call`).

The state the step writes (its trainable variables, optimizer slots, metric and seed variables) is copied
once and the split program updates the copies; what the step only reads (read-only tables and variables,
captured values) is shared. The unsplit program is what the user would run instead: in a custom loop, the
user's own step, called as the loop calls it, on the user's variables, whose values are put back exactly
when the rounds end (or fail); in fit, the step's graph imported over the copies, inside one tf.function as
fit's train function runs it. A step whose state cannot be copied (a table it writes, another kind of
resource, more than MAX_COPY_BYTES of variables) is not timed: the split is kept, and the verdict says why.
Nor is a dataset whose iteration changes what its next iterator yields (user_state.iteration_changes: a
shuffle that reshuffles each iteration, a Python generator, a function that writes state): the trial reads the
user's data only where a new iterator reads the same elements again from the start.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import tensorflow as tf

from smartstage.tf2.step.state import READ_ONLY_TABLE, READ_ONLY_VARIABLE, VALUE, VARIABLE, CapturedState
from smartstage.tf2.step.user_state import SavedValues, iteration_changes

logger = logging.getLogger(__name__)

ROUNDS = 7  # interleaved rounds per program: a median over a shared machine's bursts
# While the median of the rounds so far lies within UNSURE of the keep margin, rounds go on past ROUNDS, up to
# MAX_ROUNDS (the budget still holds): a verdict that one round more or less would flip rests on more rounds.
UNSURE = 0.05
MAX_ROUNDS = 15
ROUND_SECONDS = 0.3  # about how long one program runs per round
WARMUP_SECONDS = 0.5  # each program runs this long before the rounds: tf.data's AUTOTUNE settles its buffers
MIN_STEPS, MAX_STEPS = 5, 400  # steps per round, whatever the step's speed
# The split is kept when its median ratio reaches this. Either program trains the same values; within the
# trial's noise (a median of interleaved rounds still moves a few percent between runs on a shared machine)
# the unmodified program is kept, so a tie does not flip the route from one run to the next.
PAYS_AT = 1.05
# The trial's wall time, tracing and copying included: once it is spent, no round starts past the MIN_ROUNDS-th
# (so a trial takes BUDGET_SECONDS or its warm-up and MIN_ROUNDS rounds of MIN_STEPS steps, whichever is longer).
BUDGET_SECONDS = 15.0
MIN_ROUNDS = 3
MAX_COPY_BYTES = 1 << 30  # the variables copied for the trial, at most (a larger step is not timed)


@dataclass(frozen=True)
class Verdict:
    """The trial's outcome: per-round steps/s of each program, or why no trial ran (the split is kept)."""

    split_rates: tuple[float, ...] = ()
    unsplit_rates: tuple[float, ...] = ()
    skipped: str = ""
    threshold: float = PAYS_AT
    seconds: float = 0.0  # the trial's wall time, tracing and copying included
    steps_per_call: int = 1  # steps per call of the timed function (the model's steps_per_execution)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(s / u for s, u in zip(self.split_rates, self.unsplit_rates))

    @property
    def ratio(self) -> float | None:
        """Median split/unsplit speed over the rounds; None when nothing was timed."""
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def pays(self) -> bool:
        return self.ratio is None or self.ratio >= self.threshold

    def text(self) -> str:
        if self.ratio is None:
            return f"not timed ({self.skipped})"
        ratios = self.ratios
        per_call = f"{self.steps_per_call} steps per call, " if self.steps_per_call > 1 else ""
        return (f"the split step ran {self.ratio:.2f}x the unsplit one (median of {len(ratios)} interleaved rounds, "
                f"{min(ratios):.2f}-{max(ratios):.2f}; {per_call}{statistics.median(self.split_rates):.0f} vs "
                f"{statistics.median(self.unsplit_rates):.0f} steps/s; the split is kept from {self.threshold:.2f}x; "
                f"the trial took {self.seconds:.1f} s)")


class NotTimeable(Exception):
    """The step's state cannot be copied for a trial; the message says which capture and why."""


@dataclass(frozen=True)
class StateCopies:
    """Copies of the variables a step writes: `handles` maps id(captured handle) to the copy's handle (the
    `handles` argument of smartstage.tf2.step.functions), `variables` keeps the copies alive, and `originals`
    are the user's variables they copy, in the same order."""

    handles: dict[int, Any]
    variables: tuple[Any, ...]
    originals: tuple[Any, ...] = ()


def state_copies(states: list[CapturedState], captures, variables) -> StateCopies:
    """A copy of every variable the step may write, so a trial on the copies leaves the user's state as it
    was. Read-only captures are shared. NotTimeable for a capture that is neither.

        before:  step(batch)                      # updates the model's weights and optimizer slots
        after:   copies = state_copies(...)       # the same step, imported over `copies`, updates copies
    """
    external = {c.placeholder: c.external for c in captures}
    by_handle = {id(v.handle): v for v in variables if hasattr(v, "handle")}
    written = []
    for state in states:
        if state.kind in (READ_ONLY_VARIABLE, READ_ONLY_TABLE, VALUE):
            continue
        variable = by_handle.get(id(external.get(state.placeholder)))
        if state.kind != VARIABLE or variable is None:
            raise NotTimeable(f"the step captures {state.name!r}, {state.reason}, which a trial cannot copy")
        written.append(variable)
    size = sum(v.shape.num_elements() * v.dtype.size for v in written if v.shape.is_fully_defined())
    if size > MAX_COPY_BYTES:
        raise NotTimeable(f"the step writes {size / 2**30:.1f} GiB of variables, more than a trial copies "
                          f"({MAX_COPY_BYTES / 2**30:.0f} GiB)")
    copies = [tf.Variable(v.read_value(), trainable=False, name=f"trial_{v.name.split(':')[0]}") for v in written]
    return StateCopies({id(v.handle): c.handle for v, c in zip(written, copies)}, tuple(copies), tuple(written))


def _threshold(threshold: float | None) -> float:
    return PAYS_AT if threshold is None else threshold


def _block(outputs) -> None:
    """Waits for the step's outputs (a dispatched step returns before its kernels finish)."""
    for tensor in tf.nest.flatten(outputs):
        if hasattr(tensor, "numpy"):
            tensor.numpy()
            return


@dataclass(frozen=True)
class _Program:
    """What a round calls: `call(iterator)` runs `per_call` steps."""

    call: Callable
    per_call: int = 1


def _in_function(step: Callable, per_call: int = 1) -> _Program:
    """`per_call` steps that read their elements inside one tf.function, as Keras's train function runs a
    model compiled with steps_per_execution=per_call (a loop in the function, one call per `per_call` steps)."""
    if per_call == 1:
        one = tf.function(lambda iterator: step(next(iterator)), autograph=False)
        return _Program(lambda iterator: one(iterator))

    def several(iterator):
        def body(k):
            step(next(iterator))  # the call's updates are ordered inside the loop by automatic control deps
            return k + 1
        return tf.while_loop(lambda k: k < per_call, body, [tf.constant(0)])

    loop = tf.function(several, autograph=False)
    return _Program(lambda iterator: loop(iterator), per_call)


def _in_python(step: Callable, per_call: int = 1) -> _Program:
    """One step of a Python loop: next(iterator), then the step (a custom training loop)."""
    return _Program(lambda iterator: step(next(iterator)))


def _run(program: _Program, iterator: Iterator, steps: int) -> float:
    """Steps per second of about `steps` steps (whole calls of `program.per_call` steps, at least one)."""
    calls = max(1, round(steps / program.per_call))
    start = time.perf_counter()
    outputs = None
    for _ in range(calls):
        outputs = program.call(iterator)
    _block(outputs)
    return calls * program.per_call / (time.perf_counter() - start)


def time_programs(split: tuple[Callable, tf.data.Dataset], unsplit: tuple[Callable, tf.data.Dataset], *,
                  in_function: bool = False, rounds: int | None = None, seconds: float | None = None,
                  threshold: float | None = None, steps_per_call: int = 1) -> Verdict:
    """Interleaved rounds of two programs, each (step(element), dataset); the datasets are repeated, so a
    short dataset is no shorter trial. in_function: each step reads its element inside a tf.function (Keras's
    fit loop), `steps_per_call` steps per call (the model's steps_per_execution); otherwise next(iterator) in
    Python, then the step (a custom loop).

        before:  split program and unsplit program, one of them chosen by hand
        after:   time_programs((main, mapped), (whole, raw)).pays
    """
    return _unread(unsplit[1], threshold) or _guarded(split, unsplit, in_function, rounds, seconds, threshold,
                                                      steps_per_call=steps_per_call)


def _unread(dataset: tf.data.Dataset, threshold: float | None) -> Verdict | None:
    """The verdict for a dataset the trial must not read (user_state.iteration_changes: reading it would change
    what training reads next), checked before anything is copied or traced; None when a trial may read it."""
    why = iteration_changes(dataset)
    if why is None:
        return None
    return Verdict(skipped=why, threshold=_threshold(threshold))


def _guarded(split, unsplit, in_function: bool, rounds: int | None, seconds: float | None,
             threshold: float | None, started: float | None = None, steps_per_call: int = 1) -> Verdict:
    """_time_programs, with a dataset that yields nothing or a failing trial turned into a skipped verdict.
    `started`: when the trial began (its tracing and copying count against BUDGET_SECONDS)."""
    started = time.perf_counter() if started is None else started
    try:
        verdict = _time_programs(split, unsplit, in_function, rounds, seconds, threshold, started, steps_per_call)
        verdict = dataclasses.replace(verdict, seconds=time.perf_counter() - started)
        logger.info("trial: %s", verdict.text())  # with its wall time, known only now
        return verdict
    except (StopIteration, tf.errors.OutOfRangeError):
        return Verdict(skipped="the dataset yields no batch", threshold=_threshold(threshold))
    except Exception as e:  # a failing trial must not fail the training it only advises: the split is kept
        return _failed(e, threshold)


def _failed(error: Exception, threshold: float | None) -> Verdict:
    if isinstance(error, NotTimeable):
        return Verdict(skipped=str(error), threshold=_threshold(threshold))
    logger.warning("the trial failed, the split is kept: %s: %s", type(error).__name__,
                   (str(error).strip().splitlines() or [""])[0])
    return Verdict(skipped=f"the trial failed: {type(error).__name__}", threshold=_threshold(threshold))


def _time_programs(split, unsplit, in_function: bool, rounds: int | None, seconds: float | None,
                   threshold: float | None, started: float, steps_per_call: int = 1) -> Verdict:
    rounds = ROUNDS if rounds is None else rounds  # looked up per call, so a setting of the module's holds
    seconds = ROUND_SECONDS if seconds is None else seconds
    wrap = _in_function if in_function else _in_python
    per_call = steps_per_call if in_function else 1
    programs = {"split": (wrap(split[0], per_call), split[1]), "unsplit": (wrap(unsplit[0], per_call), unsplit[1])}
    iterators = {name: iter(dataset.repeat()) for name, (_, dataset) in programs.items()}
    for name, (step, _) in programs.items():
        _run(step, iterators[name], 3 * per_call)  # traced and built
    slowest = min(_run(step, iterators[name], MIN_STEPS) for name, (step, _) in programs.items())

    def steps_for(duration: float) -> int:  # about `duration` seconds of the slower program, whole calls
        return int(min(max(MAX_STEPS, per_call), max(MIN_STEPS, per_call, duration * slowest)))

    for name, (step, _) in programs.items():
        _run(step, iterators[name], steps_for(WARMUP_SECONDS))
    steps = steps_for(seconds)
    rates: dict[str, list[float]] = {name: [] for name in programs}
    budget = BUDGET_SECONDS  # looked up per call, as the other settings
    threshold = _threshold(threshold)
    for round_ in range(max(rounds, MAX_ROUNDS)):
        if round_ >= rounds and not _unsure(rates, threshold):
            break
        if round_ >= min(rounds, MIN_ROUNDS) and time.perf_counter() - started > budget:
            break
        order = list(programs) if round_ % 2 == 0 else list(reversed(programs))
        for name in order:
            rates[name].append(_run(programs[name][0], iterators[name], steps))
    return Verdict(tuple(rates["split"]), tuple(rates["unsplit"]), threshold=threshold, steps_per_call=per_call)


def _unsure(rates: dict[str, list[float]], threshold: float) -> bool:
    """Whether the median split/unsplit ratio of the rounds so far lies within UNSURE of `threshold`."""
    ratios = [s / u for s, u in zip(rates["split"], rates["unsplit"])]
    return bool(ratios) and abs(statistics.median(ratios) - threshold) < UNSURE


def time_split(halves, dataset: tf.data.Dataset, *, in_function: bool = False, rounds: int | None = None,
               seconds: float | None = None, threshold: float | None = None, steps_per_call: int = 1) -> Verdict:
    """The split program (the mapped dataset and the main side, on copies of the state the step writes) against
    the step it came from (the same dataset, prefetched). In a custom loop that is the user's own step, called
    as the loop calls it (_as_the_loop_calls), on the user's state, whose values are put back exactly once the
    rounds end; with in_function (fit), the step's graph imported over the copies, `steps_per_call` steps per
    call of one tf.function, as fit runs a model compiled with that steps_per_execution.

        before:  ds2, step2 = ss.tf2.split(step, ds)
        after:   time_split(ss.tf2.split(step, ds), ds).text()   # "the split step ran 1.12x the unsplit one ..."
    """
    from smartstage.tf2.step.functions import main_function, mapped_dataset, whole_step_function

    started = time.perf_counter()
    unread = _unread(dataset, threshold)
    if unread is not None:
        return unread
    traced = halves.traced
    saved = None
    try:
        copies = state_copies(halves.analysis.states, traced.captures, traced.variables)
        main = main_function(halves.sides, traced, traced.jit_compile, halves.prefetch_function.packing,
                             handles=copies.handles).get_concrete_function()
        if in_function:
            whole = whole_step_function(traced, copies.handles).get_concrete_function()
            unsplit = (lambda element: whole(*tf.nest.flatten(element, expand_composites=True)))
        else:
            unsplit = _as_the_loop_calls(traced)
            saved = SavedValues(copies.originals)
    except Exception as e:
        return _failed(e, threshold)
    mapped = mapped_dataset(dataset, halves.prefetch_function, deterministic=halves.deterministic)
    try:
        return _guarded((lambda element: main(*tf.nest.flatten(element)), mapped),
                        (unsplit, dataset.prefetch(tf.data.AUTOTUNE)), in_function, rounds, seconds, threshold,
                        started, steps_per_call)
    finally:
        if saved is not None:
            saved.restore()


def _as_the_loop_calls(traced) -> Callable:
    """The user's step as a custom loop calls it, step(batch) or step(*batch), on the user's state: a fresh
    tf.function of its Python function (trace.untouched_copy: the user's own traces stay as they were), which
    binds its arguments and traces per batch shape as the user's step does. The step's graph imported and
    called with flat tensors (what `in_function` times) ran 1.10x the user's own step here
    (`python -m benchmarks.tf2_trial_twin`), so the split timed against it read about that much too slow."""
    from smartstage.tf2.step.trace import untouched_copy

    step = untouched_copy(traced.function)
    return (lambda element: step(*element)) if traced.unpack else step


def _on_copies(step, dataset: tf.data.Dataset, roots: list) -> tuple[Callable, Any]:
    """`step` (a tf.function of one element) traced for `dataset` and imported over copies of its state:
    (a callable of one element, the copies to keep alive). NotTimeable when its state cannot be copied."""
    from smartstage.tf2.step.functions import whole_step_function
    from smartstage.tf2.step.state import classify, static_tables
    from smartstage.tf2.step.trace import trace_step

    traced = trace_step(step, dataset.element_spec, check_retrace=False)
    states = classify(traced, static_tables(roots), read_only=True)
    copies = state_copies(states, traced.captures, traced.variables)
    whole = whole_step_function(traced, copies.handles).get_concrete_function()
    return (lambda element: whole(*tf.nest.flatten(element, expand_composites=True))), copies


def time_steps(split: tuple[Any, tf.data.Dataset], unsplit: tuple[Any, tf.data.Dataset], roots: list, *,
               rounds: int | None = None, seconds: float | None = None, threshold: float | None = None,
               steps_per_call: int = 1) -> Verdict:
    """Two tf.function steps of one element, each with its dataset, timed on copies of their state (`roots`:
    the objects holding their read-only tables, as split()'s `state`). A Keras model's own train step on raw
    batches against its trainer half's on the mapped ones, for the layer-level split.

        before:  model.fit(ds)  or  trainer.fit(halves.map(ds)), chosen by hand
        after:   time_steps((trainer_step, halves.map(ds)), (model_step, ds), [model]).pays
    """
    started = time.perf_counter()
    unread = _unread(unsplit[1], threshold)
    if unread is not None:
        return unread
    try:
        split_step, split_copies = _on_copies(split[0], split[1], roots)
        unsplit_step, unsplit_copies = _on_copies(unsplit[0], unsplit[1], roots)
    except Exception as e:
        return _failed(e, threshold)
    return _guarded((split_step, split[1]), (unsplit_step, unsplit[1].prefetch(tf.data.AUTOTUNE)), True, rounds,
                    seconds, threshold, started, steps_per_call)


def time_eager_steps(split: tuple[Callable, tf.data.Dataset], unsplit: tuple[Callable, tf.data.Dataset],
                     variables: list, *, rounds: int | None = None, seconds: float | None = None,
                     threshold: float | None = None) -> Verdict:
    """Two eager steps (Python callables of one element), each with its dataset, as Keras's fit runs a model
    compiled with run_eagerly=True: the program fit would run, not its traced twin. They update `variables`
    (every variable the steps may write: the model's, its optimizer's and metrics', its seed generators),
    whose values are put back exactly afterwards.

        before:  ss.tf2.fit(eager_model, ds)      # timed as traced steps, which fit does not run
        after:   time_eager_steps((trainer.train_step, mapped), (model.train_step, ds), variables).pays
    """
    started = time.perf_counter()
    unread = _unread(unsplit[1], threshold)
    if unread is not None:
        return unread
    saved = SavedValues(variables)
    try:
        return _guarded(split, (unsplit[0], unsplit[1].prefetch(tf.data.AUTOTUNE)), False, rounds, seconds,
                        threshold, started)
    finally:
        saved.restore()


__all__ = ["MAX_COPY_BYTES", "MAX_ROUNDS", "NotTimeable", "PAYS_AT", "ROUNDS", "StateCopies", "Verdict",
           "state_copies", "time_eager_steps", "time_programs", "time_split", "time_steps"]
