"""What split(measure=True)'s trial times in a custom loop, beside what the loop then runs: the DLRM-like step.

    python -m benchmarks.tf2_trial_twin                 # device 5 ms, 5 interleaved rounds of 200 steps
    python -m benchmarks.tf2_trial_twin --device-ms 0 --repeats 7

The trial (smartstage.tf2.step.trial) cannot time the user's own step: it would train the user's variables.
It times a twin, the step's graph imported over copies of its state (functions.whole_step_function), and
calls it as a concrete function of flat tensors. Four programs, each on its own model, timed in interleaved
rounds after a settle (benchmarks.tf2.settle):

    user_step     the user's tf.function, called step(batch) as a custom loop calls it
    twin          the trial's unsplit program: the twin, called twin(*flat(batch))
    twin_called   the twin inside a tf.function of the batch, called as the user's step is
    split         split.step over split.dataset (what split(measure=False) hands back)

The trial's verdict reads split / twin; the loop gets split / user_step. Writes OUT/tf2-trial-twin-latest.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import tensorflow as tf

from benchmarks.report import DEFAULT_OUT, Spread, machine_info
from benchmarks.tf2 import Program, settle
from benchmarks.tf2_model import (Model, Tables, Tf2Options, id_space, in_model_step, make_preprocess, on_device,
                                  raw_batches)
from smartstage.examples import prepare_criteo

RATIOS = {"split/user_step": ("split", "user_step"), "split/twin": ("split", "twin"),
          "twin/user_step": ("twin", "user_step"), "twin_called/user_step": ("twin_called", "user_step")}


def programs(files, options: Tf2Options) -> tuple[dict, object]:
    """({name: (call(batch), iterator)}, the twin's state copies to keep alive): the four programs of the module
    docstring, each on its own model."""
    from smartstage import tf2
    from smartstage.tf2.step.functions import whole_step_function
    from smartstage.tf2.step.state import classify, static_tables
    from smartstage.tf2.step.trace import trace_step
    from smartstage.tf2.step.trial import state_copies

    tables = Tables(files, options)
    _, num_ids = id_space(tables, options)
    preprocess = make_preprocess(tables, options)
    raw = raw_batches(files, options)
    split = tf2.split(in_model_step(Model(num_ids, options), preprocess), raw, state=[tables])
    user = in_model_step(Model(num_ids, options), preprocess)
    traced = trace_step(in_model_step(Model(num_ids, options), preprocess), raw.element_spec, check_retrace=False)
    copies = state_copies(classify(traced, static_tables([tables]), True), traced.captures, traced.variables)
    whole = whole_step_function(traced, copies.handles).get_concrete_function()
    as_called = tf.function(lambda *args: whole(*tf.nest.flatten(args, expand_composites=True)), autograph=False)

    def fresh():
        return iter(raw.prefetch(tf.data.AUTOTUNE))

    return {"user_step": (user, fresh()),
            "twin": (lambda batch: whole(*tf.nest.flatten(batch, expand_composites=True)), fresh()),
            "twin_called": ((lambda batch: as_called(*batch)) if traced.unpack else as_called, fresh()),
            "split": (split.step, iter(split.dataset))}, copies


def measure(rows: int, device_ms: float, repeats: int, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="smartstage-trial-twin-") as tmp:
        files = prepare_criteo(tmp, num_rows=rows, seed=0)
        built, _copies = programs(files, on_device(Tf2Options(), device_ms))
        timed = {name: Program(name, call, iterator) for name, (call, iterator) in built.items()}
        for program in timed.values():
            program.timed(warmup)
        rates: dict[str, list[float]] = {name: [] for name in timed}
        for round_ in range(repeats):
            names = list(timed)[round_ % len(timed):] + list(timed)[:round_ % len(timed)]
            for name in names:
                settle()
                rates[name].append(timed[name].timed(steps))
    ratios = {key: [a / b for a, b in zip(rates[top], rates[bottom])] for key, (top, bottom) in RATIOS.items()}
    return {"device_ms": device_ms, "repeats": repeats, "steps": steps,
            "steps_per_second": {k: {"values": v, "spread": asdict(Spread.of(v))} for k, v in rates.items()},
            "ratios": {k: {"values": v, "spread": asdict(Spread.of(v))} for k, v in ratios.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-ms", type=float, default=5.0, help="the emulated accelerator's ms per step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 5 steps on 2,000 rows")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.steps, args.rows = 2, 5, 2_000
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    result = measure(args.rows, args.device_ms, args.repeats, args.steps, warmup=min(30, args.steps))
    result["machine"] = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tf2-trial-twin-latest.json").write_text(json.dumps(result, indent=1))
    for key, value in result["ratios"].items():
        spread = Spread(**value["spread"])
        print(f"{key}: {spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f}), {spread.n} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
