"""TF2 benchmark under tf.distribute.MirroredStrategy: ss.tf2.fit's step route against model.fit, two replicas.

    python -m benchmarks.tf2_strategy              # tf_keras functional and subclassed CTR models, CPU and 5 ms device
    python -m benchmarks.tf2_strategy --quick      # fewer rows and steps
    python -m benchmarks.tf2_strategy --smoke      # the smallest run (the tests')
    python -m benchmarks.tf2_strategy --publish    # also writes docs/perf/tf2-strategy.{json,md}

The host's CPU is split into two logical devices, one replica each (as two GPUs would hold one each). Each Keras
kind of benchmarks/tf2_kinds.py with string inputs that model.fit takes under a strategy (tf_keras functional
and subclassed: Keras 3's model.fit averages a first batch over the replicas, which strings cannot take) is
built three times under the strategy, from the same seeds:
  model.fit     the model with its preprocessing inside: each replica preprocesses its slice in its step
  ss.tf2.fit    the same model through ss.tf2.fit(measure=False): each replica's preprocessing in the dataset
  control       a second copy of the first, model.fit again: the same program, timed in the same rounds
First the three train one epoch of `check` steps and their losses are compared bit for bit. Then `repeats`
rounds, each timing one fit(epochs=1) call of `steps` batches per program in a rotated order; the ratios are
taken within each round. Reported: median and range of steps/s and of ss.tf2.fit / model.fit, beside the
control's model.fit / model.fit, and a one-sided permutation test of whether ss.tf2.fit's ratios lie below the
control's (benchmarks.side_by_side.slower_p): whole fit calls on a shared host run at rate levels a factor of
two apart, and the control shows what that alone does to a ratio in the same rounds. A split under a strategy
is not timed by fit (measure=True keeps it), so this is the number that says whether it pays.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from typing import Any

from benchmarks.fit_rounds import FitMode, add_mode_arguments, chosen_mode, command_line, fit_rounds
from benchmarks.side_by_side import slower_p, slower_text

REPLICAS = 2
KINDS = ("tf_keras_functional", "tf_keras_subclassed")
PROGRAMS = ("model_fit", "smartstage_fit", "control")

logger = logging.getLogger(__name__)


def _configure_devices() -> None:
    """Two logical CPU devices, before TensorFlow initializes its devices (one replica each)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    tf.config.experimental.enable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})


def measure(kind: str, files, options, mode: FitMode, strategy) -> dict[str, Any]:
    """One kind in one setting: losses compared, then interleaved timed rounds."""
    import numpy as np

    import smartstage.tf2 as sst
    from benchmarks.tf2_kinds import build_model, keras_batches

    raw = keras_batches(files, options)
    sample = raw.take(4)
    with strategy.scope():
        models = {p: build_model(kind, files, options, sample)[0] for p in PROGRAMS}

    def run(program: str, steps: int):
        data = raw.take(steps)
        model = models[program]
        if program != "smartstage_fit":
            return model.fit(data, epochs=1, verbose=0)
        return sst.fit(model, data, epochs=1, verbose=0, measure=False)

    histories = {p: run(p, mode.check) for p in PROGRAMS}  # also traces all three and splits once
    losses = {p: histories[p].history["loss"] for p in PROGRAMS}
    identical = losses["model_fit"] == losses["smartstage_fit"] == losses["control"]
    # equal_nan: the model's first MLP kernel holds NaNs after a few steps in both programs alike.
    weights = all(np.array_equal(a, b, equal_nan=True) for p in ("smartstage_fit", "control")
                  for a, b in zip(models["model_fit"].get_weights(), models[p].get_weights()))
    split = histories["smartstage_fit"].smartstage
    rates = fit_rounds(run, PROGRAMS, mode.steps, mode.repeats)
    ratios = [s / m for s, m in zip(rates["smartstage_fit"], rates["model_fit"])]
    control = [c / m for c, m in zip(rates["control"], rates["model_fit"])]
    return {"kind": kind, "device_ms": options.device_ms, "losses_identical": identical,
            "weights_identical": weights, "moved": len(split.train.split.moved),
            "boundary": len(split.train.split.boundary), "rates": rates, "ratios": ratios,
            "control_ratios": control, "below_control_p": slower_p(control, ratios)}


def report_text(result: dict[str, Any]) -> str:
    from benchmarks.report import Spread, machine_line, markdown_table

    def spread(values: list[float]) -> str:
        return Spread.of(values).text(digits=2)

    lines = [f"# ss.tf2.fit under MirroredStrategy ({REPLICAS} replicas on logical CPU devices)", "",
             f"Run on {result['date']}. Command: `{result['command']}`. {machine_line(result['machine'])}", "",
             f"{result['settings_mode']}. Op determinism on, Grappler's arithmetic optimizer off.", ""]
    rows = []
    for m in result["measured"]:
        setting = "CPU" if m["device_ms"] == 0 else f"device {m['device_ms']:g} ms"
        rows.append([m["kind"], setting, f"{m['moved']} / {m['boundary']}",
                     "yes" if m["losses_identical"] and m["weights_identical"] else "NO",
                     spread(m["rates"]["model_fit"]), spread(m["rates"]["smartstage_fit"]), spread(m["ratios"]),
                     spread(m["control_ratios"]), slower_text(m["below_control_p"])])
    lines.append(markdown_table(["kind", "setting", "ops moved / boundary tensors per replica",
                                 "losses and weights identical", "model.fit steps/s", "ss.tf2.fit steps/s",
                                 "ss.tf2.fit / model.fit", "control: model.fit again / model.fit",
                                 "ss.tf2.fit below the control?"], rows))
    lines.append("")
    lines.append("Medians with the range over the rounds; the ratios are taken within each round. The control is "
                 "a second copy of the model trained by model.fit in the same rounds; the last column is a "
                 "one-sided permutation test of the two ratios' rounds (\"slower\" from p < 0.05). Steps/s of each "
                 "round, in the order run:")
    lines.append("")
    for m in result["measured"]:
        setting = "CPU" if m["device_ms"] == 0 else f"device {m['device_ms']:g} ms"
        lines.append(f"- {m['kind']}, {setting}: model.fit "
                     f"{', '.join(f'{r:.0f}' for r in m['rates']['model_fit'])}; ss.tf2.fit "
                     f"{', '.join(f'{r:.0f}' for r in m['rates']['smartstage_fit'])}; control "
                     f"{', '.join(f'{r:.0f}' for r in m['rates']['control'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mode_arguments(parser, "tf2-strategy")
    args = parser.parse_args(argv)
    _configure_devices()
    import tensorflow as tf

    from benchmarks.report import DEFAULT_OUT, load_average, machine_info, write_outputs
    from benchmarks.tf2_model import Tf2Options, on_device
    from smartstage.examples import prepare_criteo

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mode_name, mode = chosen_mode(args)
    # Reduction to one device: with the default collective all-reduce on logical CPU devices, whole fit calls of
    # model.fit alone ran at 1/2 or 1/4 of the others' rate (steps/s clustered at 14, 28, 55 and 110).
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    options = Tf2Options(per_example_loss=True)
    measured = []
    with tempfile.TemporaryDirectory(prefix="smartstage-tf2-strategy-") as tmp:
        files = prepare_criteo(tmp, num_rows=mode.rows, seed=0)
        for device_ms in (0.0, args.device_ms):
            for kind in KINDS:
                logger.info("measuring %s, device_ms=%g", kind, device_ms)
                measured.append(measure(kind, files, on_device(options, device_ms), mode, strategy))
    result = {"benchmark": "tf2_strategy", "mode": mode_name, "date": time.strftime("%Y-%m-%d"), "machine": machine_info(), "measured": measured,
              "command": command_line("tf2_strategy", args),
              "settings_mode": f"{mode.rows} rows, batch {options.batch_size} (split over {REPLICAS} replicas, "
                               "gradients reduced to one device), "
                               f"{mode.repeats} rounds of one {mode.steps}-step fit call per program after a "
                               f"{mode.check}-step call that compares the losses",
              "load_average_at_end": load_average()}
    text = report_text(result)
    print(text)
    write_outputs(args.out or DEFAULT_OUT, "tf2-strategy", result, publish=args.publish, text=text)
    return 0 if all(m["losses_identical"] and m["weights_identical"] for m in measured) else 1


if __name__ == "__main__":
    raise SystemExit(main())
