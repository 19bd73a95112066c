"""TF2 benchmark of ss.tf2.fit's two routes on the Keras 3 models both can split: layer level against op level.

    python -m benchmarks.tf2_routes              # Keras 3 functional and FeatureSpace CTR models, CPU and 5 ms device
    python -m benchmarks.tf2_routes --quick      # fewer rows and steps
    python -m benchmarks.tf2_routes --smoke      # the smallest run
    python -m benchmarks.tf2_routes --publish    # also writes docs/perf/tf2-routes.{json,md}
    python -m benchmarks.tf2_routes --smoke --kinds keras3_functional   # one kind only

A Keras 3 functional model with the stock train step can be split two ways by ss.tf2.fit: at layer level
(the preprocessing layers in the dataset, a trainer model of the remaining layers fit on it) or at op level
(the model's own train step split, its own fit run on the mapped dataset: the route of every other model).
Each kind of benchmarks/tf2_kinds.py that is a Keras 3 functional model is built three times from the same
seeds and trained on the same batches:
  model.fit     the model with its preprocessing inside
  layer route   ss.tf2.fit(model, ..., measure=False) cut at layer level
  step route    the same call with the layer route turned off, so the model's train step is split at op level
First each trains one epoch of `check` steps, and the per-step losses and the weights are compared bit for bit
(op determinism on). Then `repeats` rounds, each timing one fit(epochs=1) call of `steps` batches per program in
a rotated order; ratios are taken within each round. Reported: median and range of steps/s and of the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import time
from typing import Any, Iterator

from benchmarks.fit_rounds import FitMode, add_mode_arguments, batch_losses, chosen_mode, command_line, fit_rounds

KINDS = ("keras3_functional", "keras3_featurespace")
PROGRAMS = ("model_fit", "layer_route", "step_route")

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def step_route_only() -> Iterator[None]:
    """For the duration, ss.tf2.fit finds no layer-level split, so every model takes the step route (the
    benchmark replaces fit's private chooser: the route is no option of the public API)."""
    from smartstage.tf2.keras import fit as keras_fit

    layer_split = keras_fit._layer_split
    keras_fit._layer_split = lambda *args, **kwargs: None
    try:
        yield
    finally:
        keras_fit._layer_split = layer_split


def measure(kind: str, files, options, mode: FitMode) -> dict[str, Any]:
    """One kind in one setting: losses and weights compared, then interleaved timed rounds."""
    import numpy as np

    import smartstage.tf2 as sst
    from benchmarks.tf2_kinds import build_model, keras_batches

    raw = keras_batches(files, options)
    sample = raw.take(4)
    models = {p: build_model(kind, files, options, sample)[0] for p in PROGRAMS}

    def run(program: str, steps: int, callbacks=()):
        data = raw.take(steps)
        model = models[program]
        if program == "model_fit":
            return model.fit(data, epochs=1, verbose=0, callbacks=list(callbacks))
        route = step_route_only() if program == "step_route" else contextlib.nullcontext()
        with route:
            return sst.fit(model, data, epochs=1, verbose=0, measure=False, callbacks=list(callbacks))

    recorders = {p: batch_losses(models[p]) for p in PROGRAMS}
    histories = {p: run(p, mode.check, [recorders[p]]) for p in PROGRAMS}  # traces each and splits once
    routes = {p: type(histories[p].smartstage).__name__ for p in PROGRAMS[1:]}
    expected = {"layer_route": "KerasSplit", "step_route": "StepFit"}
    if routes != expected:
        raise RuntimeError(f"{kind}: the routes taken were {routes}, not {expected}")
    losses = {p: recorders[p].losses == recorders["model_fit"].losses for p in PROGRAMS[1:]}
    # equal_nan for floats: the CTR model's first MLP kernel holds NaNs after a few steps in every program alike.
    weights = {p: all(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
                      for a, b in zip(models["model_fit"].get_weights(), models[p].get_weights()))
               for p in PROGRAMS[1:]}
    rates = fit_rounds(run, PROGRAMS, mode.steps, mode.repeats)
    ratios = {"layer_route": [a / b for a, b in zip(rates["layer_route"], rates["model_fit"])],
              "step_route": [a / b for a, b in zip(rates["step_route"], rates["model_fit"])],
              "layer_over_step": [a / b for a, b in zip(rates["layer_route"], rates["step_route"])]}
    return {"kind": kind, "device_ms": options.device_ms, "losses_identical": losses, "weights_identical": weights,
            "rates": rates, "ratios": ratios}


def report_text(result: dict[str, Any]) -> str:
    from benchmarks.report import Spread, machine_line, markdown_table

    def spread(values: list[float]) -> str:
        return Spread.of(values).text(digits=2)

    lines = ["# ss.tf2.fit's layer route against its step route (Keras 3 functional models)", "",
             f"Run on {result['date']}. Command: `{result['command']}`. {machine_line(result['machine'])}", "",
             f"{result['settings_mode']}. Op determinism on, Grappler's arithmetic optimizer off.", ""]
    rows = []
    for m in result["measured"]:
        setting = "CPU" if m["device_ms"] == 0 else f"device {m['device_ms']:g} ms"
        same = {p: "yes" if m["losses_identical"][p] and m["weights_identical"][p] else "NO" for p in PROGRAMS[1:]}
        rows.append([m["kind"], setting, same["layer_route"], same["step_route"],
                     spread(m["rates"]["model_fit"]), spread(m["rates"]["layer_route"]),
                     spread(m["rates"]["step_route"]), spread(m["ratios"]["layer_route"]),
                     spread(m["ratios"]["step_route"]), spread(m["ratios"]["layer_over_step"])])
    lines.append(markdown_table(["kind", "setting", "layer route = model.fit", "step route = model.fit",
                                 "model.fit steps/s", "layer route steps/s", "step route steps/s",
                                 "layer / model.fit", "step / model.fit", "layer / step"], rows))
    lines.append("")
    lines.append("Medians with the range over the rounds; each ratio is taken within a round. '= model.fit': "
                 "per-step losses and final weights bit-identical to model.fit's after the check call.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mode_arguments(parser, "tf2-routes")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds: {', '.join(unknown) or 'none given'}; choose from {', '.join(KINDS)}")
    import tensorflow as tf

    from benchmarks.report import DEFAULT_OUT, load_average, machine_info, write_outputs
    from benchmarks.tf2_model import Tf2Options, on_device
    from smartstage.examples import prepare_criteo

    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mode_name, mode = chosen_mode(args)
    options = Tf2Options()
    measured = []
    load_at_start = load_average()
    with tempfile.TemporaryDirectory(prefix="smartstage-tf2-routes-") as tmp:
        files = prepare_criteo(tmp, num_rows=mode.rows, seed=0)
        for device_ms in (0.0, args.device_ms):
            for kind in kinds:
                logger.info("measuring %s, device_ms=%g", kind, device_ms)
                measured.append(measure(kind, files, on_device(options, device_ms), mode))
    result = {"benchmark": "tf2_routes", "mode": mode_name, "date": time.strftime("%Y-%m-%d"),
              "machine": machine_info(), "measured": measured,
              "command": command_line("tf2_routes", args,
                                      *([] if kinds == list(KINDS) else ["--kinds", ",".join(kinds)])),
              "settings_mode": f"{mode.rows} rows, batch {options.batch_size}, {mode.repeats} rounds of one "
                               f"{mode.steps}-step fit call per program after a {mode.check}-step call that "
                               "compares the values",
              "load_average_at_start": load_at_start, "load_average_at_end": load_average()}
    text = report_text(result)
    print(text)
    write_outputs(args.out or DEFAULT_OUT, "tf2-routes", result, publish=args.publish, text=text)
    same = all(all(m["losses_identical"].values()) and all(m["weights_identical"].values()) for m in measured)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
