"""Interleaved rounds of whole `fit` calls, for the benchmarks that compare ways of training a Keras model
(benchmarks.tf2_strategy, benchmarks.tf2_routes). Imports no TensorFlow: a benchmark may configure its devices
first.

    mode = FIT_MODES["full"]
    rates = fit_rounds(run, ("model_fit", "smartstage_fit"), mode.steps, mode.repeats)  # steps/s per round
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class FitMode:
    rows: int  # rows of the Criteo-like CSV
    steps: int  # batches per timed fit call
    check: int  # batches of the first call, whose values are compared
    repeats: int  # timed rounds


FIT_MODES = {"full": FitMode(rows=60_000, steps=300, check=20, repeats=7),
             "quick": FitMode(rows=20_000, steps=40, check=10, repeats=5),
             "smoke": FitMode(rows=3_000, steps=4, check=3, repeats=2)}


def add_mode_arguments(parser: argparse.ArgumentParser, stem: str) -> None:
    """The arguments every fit benchmark takes: --quick, --smoke, --device-ms, --repeats, --out, --publish
    (which writes docs/perf/<stem>.{json,md})."""
    parser.add_argument("--quick", action="store_true", help="fewer rows and steps")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (the tests')")
    parser.add_argument("--device-ms", type=float, default=5.0, help="the emulated accelerator's ms per step")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default: the mode's)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help=f"also write docs/perf/{stem}.{{json,md}}")


def chosen_mode(args: argparse.Namespace) -> tuple[str, FitMode]:
    """(the mode's name, the mode with --repeats applied) of parsed add_mode_arguments arguments."""
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    return name, replace(FIT_MODES[name], repeats=args.repeats or FIT_MODES[name].repeats)


def command_line(module: str, args: argparse.Namespace, *extra: str) -> str:
    """The command that re-runs this run: `python -m benchmarks.<module>` with its mode, `extra` and --repeats."""
    name, _ = chosen_mode(args)
    parts = [f"python -m benchmarks.{module}"] + ([f"--{name}"] if name != "full" else []) + list(extra)
    return " ".join(parts + ([f"--repeats {args.repeats}"] if args.repeats else []))


def batch_losses(model):
    """A callback of the model's Keras (Keras 3 or tf_keras) that records every training batch's logged loss
    (`.losses`, in order): what the fit benchmarks and the tests compare bit for bit.

        losses = batch_losses(model);  model.fit(ds, callbacks=[losses]);  losses.losses -> [0.69, 0.68, ...]
    """
    import keras

    if isinstance(model, keras.Model):
        base = keras.callbacks.Callback
    else:
        import tf_keras

        base = tf_keras.callbacks.Callback

    class BatchLosses(base):
        def __init__(self):
            super().__init__()
            self.losses: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    return BatchLosses()


def fit_rounds(run: Callable[[str, int], Any], programs: Sequence[str], steps: int,
               repeats: int) -> dict[str, list[float]]:
    """Steps/s of each program in each of `repeats` rounds: a round calls run(program, steps) once per program,
    the order rotated by one each round (a load change hits every program), each call timed whole after a
    gc.collect() (the previous call's iterators, and their tf.data threads, end before the clock starts)."""
    programs = tuple(programs)
    rates: dict[str, list[float]] = {p: [] for p in programs}
    for k in range(repeats):
        shift = k % len(programs)
        for program in programs[shift:] + programs[:shift]:
            gc.collect()
            start = time.perf_counter()
            run(program, steps)
            rates[program].append(steps / (time.perf_counter() - start))
    return rates


__all__ = ["FIT_MODES", "FitMode", "add_mode_arguments", "batch_losses", "chosen_mode", "command_line", "fit_rounds"]
