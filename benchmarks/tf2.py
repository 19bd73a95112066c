"""TF2 benchmark: SmartStage's split of a tf.function step against the in-model baseline and the hand-written map.

    python -m benchmarks.tf2                  # CPU and the accelerator-emulated step (5 ms), 5 interleaved repeats
    python -m benchmarks.tf2 --quick          # fewer rows and steps (development on a shared machine)
    python -m benchmarks.tf2 --smoke          # the smallest run (the DLRM-like step only unless --kinds names more)
    python -m benchmarks.tf2 --publish        # also writes docs/perf/tf2.{json,md,png} and a dated copy
    python -m benchmarks.tf2 --kinds keras3_subclassed,tf_keras_functional   # some model kinds only

Three programs train the DLRM-like model of benchmarks/tf2_model.py on the same batches:
  in-model      the step preprocesses the raw columns itself (`for columns in raw: step(columns)`)
  hand-written  the TF guide's way: `raw.map(preprocess, AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)`
                and a step that takes the preprocessed features (a second program the user writes by hand)
  SmartStage    the in-model step and `raw` given to smartstage.tf2, which moves what it may into the dataset
The same three ways train each Keras model kind of benchmarks/tf2_kinds.py (tf_keras functional and subclassed,
Keras 3 subclassed, Keras 3 FeatureSpace): the model with its preprocessing layers inside, on its own
train_step; the preprocessing layers in a hand-written map and a second model on their outputs; SmartStage's
split of the model's train_step. Each on the host CPU (device_ms=0) and with the model's compute on an emulated accelerator (a host-idle wait of
device_ms per step, benchmarks/accelerator.py, and a tiny model on the host: tf2_model.on_device). Per setting: the
first steps' losses of the three programs are compared bit for bit; then `repeats` rounds, each timing every
program for `steps` steps in a rotated order (interleaved: a load change hits all three), each after the other
programs' pipelines have refilled their buffers (settle()), and the ratios are taken within each round.
Reported: median and range of steps/s and of the ratios, the machine's load, and the targets (>= 0.95x
hand-written everywhere, >= 1.3x in-model where the limit allows it).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf

from benchmarks.report import (DEFAULT_OUT, PUBLISH_DIR, Spread, load_average, machine_info, machine_line,
                               markdown_table, write_outputs)
from benchmarks.tf2_kinds import KINDS, smartstage_programs
from benchmarks.tf2_model import (Model, Tables, Tf2Options, id_space, in_model_step, make_preprocess, on_device,
                                  preprocessed_step, raw_batches)
from smartstage.examples import prepare_criteo

logger = logging.getLogger(__name__)

PROGRAMS = ("in_model", "handwritten", "smartstage", "split_untimed")
STEP_KIND = "dlrm_step"  # the DLRM-like tf.function step of benchmarks/tf2_model.py
TITLES = {"in_model": "in-model (preprocessing in the step)", "handwritten": "hand-written dataset.map",
          "smartstage": "SmartStage (split, measure=True)", "split_untimed": "split, measure=False"}


@dataclass(frozen=True)
class Mode:
    rows: int
    repeats: int
    steps: int
    warmup: int
    check_steps: int


MODES = {"full": Mode(rows=40_000, repeats=5, steps=200, warmup=30, check_steps=50),
         "quick": Mode(rows=8_000, repeats=5, steps=40, warmup=10, check_steps=20),
         "smoke": Mode(rows=1_000, repeats=2, steps=3, warmup=1, check_steps=3)}


@dataclass
class Program:
    """One way to train: its dataset iterator and step (each program has its own copy of the model)."""

    name: str
    step: Callable
    iterator: Any
    notes: str = ""

    def run(self, steps: int) -> list[float]:
        return [float(self.step(next(self.iterator))) for _ in range(steps)]

    def timed(self, steps: int) -> float:
        start = time.perf_counter()
        loss = None
        for _ in range(steps):
            loss = self.step(next(self.iterator))
        float(loss)
        return steps / (time.perf_counter() - start)


def settle(limit_seconds: float = 5.0, window: float = 0.1, idle_share: float = 0.1) -> float:
    """Waits until this process's threads use less than `idle_share` of one core over `window` seconds (at most
    `limit_seconds`); the seconds waited. Every program keeps its iterator between its timed runs, and a
    program's tf.data threads refill its prefetch buffer after it stops: without the wait, the program timed
    next would pay for that refill."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_seconds:
        cpu = time.process_time()
        time.sleep(window)
        if time.process_time() - cpu < idle_share * window:
            break
    return time.perf_counter() - start


def side_millis(files, options: Tf2Options, steps: int) -> dict[str, Spread]:
    """The two sides alone, on one fixed batch, ms per call: the step with its preprocessing inside, the step on
    preprocessed features, and the preprocessing as a tf.function. With a core for each side, overlapping them
    bounds the speed-up of moving the preprocessing out at about in_model_step / max(train_step, preprocess)."""
    tables = Tables(files, options)
    _, num_ids = id_space(tables, options)
    preprocess = make_preprocess(tables, options)
    columns = next(iter(raw_batches(files, options)))
    features = preprocess(columns)
    calls = {"in_model_step": (in_model_step(Model(num_ids, options), preprocess), columns),
             "train_step": (preprocessed_step(Model(num_ids, options)), features),
             "preprocess": (tf.function(preprocess), columns)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(3):
        for name, (function, argument) in calls.items():
            tf.nest.map_structure(lambda t: t.numpy(), function(argument))  # traced and warm
            start = time.perf_counter()
            for _ in range(steps):
                result = function(argument)
            tf.nest.map_structure(lambda t: t.numpy(), result)
            times[name].append((time.perf_counter() - start) / steps * 1000)
    return {name: Spread.of(values) for name, values in times.items()}


def build_programs(files, options: Tf2Options) -> dict[str, Program]:
    tables = Tables(files, options)
    _, num_ids = id_space(tables, options)
    preprocess = make_preprocess(tables, options)
    raw = raw_batches(files, options)
    programs = {}
    step = in_model_step(Model(num_ids, options), preprocess)
    programs["in_model"] = Program("in_model", step, iter(raw.prefetch(tf.data.AUTOTUNE)))
    handwritten = raw.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    programs["handwritten"] = Program("handwritten", preprocessed_step(Model(num_ids, options)),
                                      iter(handwritten.prefetch(tf.data.AUTOTUNE)))
    # `state=[tables]`: the vocabulary tables live in the closure of `preprocess`, a function the step calls,
    # which split() does not search (it searches the step's own closure, its object and its globals).
    for name, step, dataset, notes in smartstage_programs(in_model_step(Model(num_ids, options), preprocess),
                                                          in_model_step(Model(num_ids, options), preprocess), raw,
                                                          [tables]):
        programs[name] = Program(name, step, iter(dataset), notes)
    return programs


def kind_programs(kind: str, files, options: Tf2Options) -> dict[str, Program]:
    """The three programs of a Keras model kind (benchmarks/tf2_kinds.py)."""
    from benchmarks.tf2_kinds import build_programs as build_kind

    built = build_kind(kind, files, options)
    return {name: Program(name, step, iter(dataset), built.notes.get(name, ""))
            for name, (dataset, step) in built.programs.items()}


def measure(files, options: Tf2Options, mode: Mode, kind: str = STEP_KIND) -> dict[str, Any]:
    """One setting (CPU or emulated device) of one kind: losses compared, then interleaved timed rounds."""
    programs = build_programs(files, options) if kind == STEP_KIND else kind_programs(kind, files, options)
    losses = {name: program.run(mode.check_steps) for name, program in programs.items()}
    identical = {name: losses[name] == losses["in_model"] for name in PROGRAMS}
    for program in programs.values():
        program.run(mode.warmup)
    sides = side_millis(files, options, max(mode.steps // 4, 2)) if kind == STEP_KIND else None
    rates: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    loads = []
    for round_ in range(mode.repeats):
        order = PROGRAMS[round_ % len(PROGRAMS):] + PROGRAMS[:round_ % len(PROGRAMS)]
        for name in order:
            settle()
            rates[name].append(programs[name].timed(mode.steps))
        loads.append(load_average())
    ratios = {
        "smartstage/in_model": [s / b for s, b in zip(rates["smartstage"], rates["in_model"])],
        "smartstage/handwritten": [s / h for s, h in zip(rates["smartstage"], rates["handwritten"])],
        "handwritten/in_model": [h / b for h, b in zip(rates["handwritten"], rates["in_model"])],
        "split_untimed/in_model": [s / b for s, b in zip(rates["split_untimed"], rates["in_model"])],
    }
    return {
        "device_ms": options.device_ms,
        "steps_per_second": {name: {"values": values, "spread": Spread.of(values)} for name, values in rates.items()},
        "ratios": {name: {"values": values, "spread": Spread.of(values)} for name, values in ratios.items()},
        "losses_identical": identical,
        "check_steps": mode.check_steps,
        "first_losses": {name: values[:3] for name, values in losses.items()},
        "load_average_per_round": loads,
        "sides_ms": sides,
        "overlap_limit": None if sides is None else
        sides["in_model_step"].median / max(sides["train_step"].median, sides["preprocess"].median),
        "split_notes": programs["split_untimed"].notes,
        "kept": _kept(programs["smartstage"].notes),
        "boundary_tensors": _boundary_count(programs["split_untimed"].notes),
    }


def _kept(notes: str) -> str:
    """What split(measure=True) kept, and the trial's ratio: "split (1.12x)" or "unsplit (0.84x)"."""
    import re

    found = re.search(r"the split step ran ([0-9.]+)x", notes)
    ratio = f" ({found.group(1)}x)" if found else ""
    return ("unsplit" if notes.startswith("kept unsplit") else "split") + ratio


def _boundary_count(notes: str) -> int | None:
    import re

    found = re.search(r"(\d+) tensor\(s\) per element", notes)
    return int(found.group(1)) if found else None


def _setting_name(device_ms: float) -> str:
    return "CPU" if device_ms <= 0 else f"accelerator (emulated, {device_ms:g} ms/step)"


def report_text(result: dict[str, Any]) -> str:
    lines = ["# TF2 benchmark: SmartStage's split of a tf.function step", "",
             f"Run on {result['machine'].get('date')}. Machine: {machine_line(result['machine'])}. Mode `{result['mode']}`: {result['settings_mode']}.", "",
             f"Command: `{result['command']}`", "",
             "Every program with `tf.config.experimental.enable_op_determinism()` and Grappler's arithmetic optimizer "
             + ("on" if result["grappler_arithmetic_optimization"] else "off (it rewrites the in-model step across the "
                "cut, and the split's losses then differ in the last bits)") + ".", ""]
    rows = []
    for setting in result["settings"]:
        name = _setting_name(setting["device_ms"])
        rates = setting["steps_per_second"]
        ratios = setting["ratios"]
        rows.append([name, *(rates[p]["spread"].text(1) for p in PROGRAMS),
                     ratios["smartstage/handwritten"]["spread"].text(2),
                     ratios["smartstage/in_model"]["spread"].text(2), setting.get("kept", "-"),
                     "yes" if all(setting["losses_identical"].values()) else "NO"])
    lines.append(markdown_table(["setting", *(f"{TITLES[p]} steps/s" for p in PROGRAMS), "SmartStage / hand-written",
                                 "SmartStage / in-model", "SmartStage kept (timed split/unsplit)",
                                 f"losses identical ({result['check_steps']} steps)"], rows))
    lines += ["", "Steps/s: median (min-max) of the rounds; ratios: median (min-max) of the per-round ratios. "
              "SmartStage is split(measure=True): the split is timed against the in-model step on copies of the "
              "model's state (smartstage.tf2.step.trial) and kept only when it runs faster, as ss.tf2.fit does; "
              "\"split, measure=False\" is the split whatever the timing says.", "", "## Targets", ""]
    checks = []
    for setting in result["settings"]:
        name = _setting_name(setting["device_ms"])
        hand = setting["ratios"]["smartstage/handwritten"]["spread"]
        base = setting["ratios"]["smartstage/in_model"]["spread"]
        limit = setting["ratios"]["handwritten/in_model"]["spread"]
        checks.append([name, ">= 0.95x hand-written", f"{hand.median:.2f}x",
                       "met" if hand.median >= 0.95 else "NOT met"])
        overlap = setting["overlap_limit"]
        if base.median >= 1.3:
            verdict = "met"
        elif overlap < 1.3:
            verdict = f"not met: the limit is {overlap:.2f}x (sides below)"
        elif limit.median < 1.3:
            verdict = f"not met: the hand-written map reaches {limit.median:.2f}x here too (no free core)"
        else:
            verdict = "NOT met"
        checks.append([name, f">= 1.3x in-model where the limit allows (limit {overlap:.2f}x)", f"{base.median:.2f}x",
                       verdict])
    lines.append(markdown_table(["setting", "target", "measured (median)", "result"], checks))
    lines += ["", "## The sides alone (one fixed batch, ms per call, median (min-max) of 3)", ""]
    sides = [[_setting_name(s["device_ms"]), *(s["sides_ms"][k].text(2) for k in ("in_model_step", "train_step",
                                                                                  "preprocess")),
              f"{s['overlap_limit']:.2f}x"] for s in result["settings"]]
    lines.append(markdown_table(["setting", "in-model step", "step on preprocessed features", "preprocess alone",
                                 "limit: in-model / max(step, preprocess)"], sides))
    lines += ["", "The limit holds with a free core for each side; on a shared machine the hand-written map's own "
              "ratio shows what the cores allowed in the same rounds."]
    lines += kinds_report(result.get("kinds", {}))
    loads = [setting["load_average_per_round"] for setting in result["settings"]]
    lines += ["", f"Load average (1 min) after each round: {[[l[0] for l in ls if l] for ls in loads]}; "
              f"at the end {result['load_average_at_end']}.", ""]
    return "\n".join(lines) + "\n"


def kinds_report(kinds: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The Keras model kinds: one row per kind and setting."""
    if not kinds:
        return []
    rows, checks = [], []
    for kind, settings in kinds.items():
        for setting in settings:
            rates, ratios = setting["steps_per_second"], setting["ratios"]
            rows.append([kind, _setting_name(setting["device_ms"]), *(rates[p]["spread"].text(1) for p in PROGRAMS),
                         ratios["smartstage/handwritten"]["spread"].text(2), ratios["smartstage/in_model"]["spread"].text(2),
                         ratios["split_untimed/in_model"]["spread"].text(2), setting.get("kept", "-"),
                         setting["boundary_tensors"],
                         "yes" if setting["losses_identical"]["smartstage"] and setting["losses_identical"]
                         ["split_untimed"] else "NO"])
            checks.append([kind, _setting_name(setting["device_ms"]), ">= 0.97x in-model",
                           ratios["smartstage/in_model"]["spread"].text(2),
                           "met" if ratios["smartstage/in_model"]["spread"].median >= 0.97 else "NOT met"])
            checks.append([kind, _setting_name(setting["device_ms"]), ">= 0.95x hand-written",
                           ratios["smartstage/handwritten"]["spread"].text(2),
                           "met" if ratios["smartstage/handwritten"]["spread"].median >= 0.95 else "NOT met"])
            base, hand = ratios["smartstage/in_model"]["spread"], ratios["handwritten/in_model"]["spread"]
            checks.append([kind, _setting_name(setting["device_ms"]), ">= 1.3x in-model where the cores leave room",
                           base.text(2), "met" if base.median >= 1.3 else
                           f"not met: the hand-written map reaches {hand.median:.2f}x here too (no free core)"
                           if hand.median < 1.3 else "NOT met"])
    return ["", "## Keras model kinds (benchmarks/tf2_kinds.py)", "",
            markdown_table(["kind", "setting", *(f"{TITLES[p]} steps/s" for p in PROGRAMS), "SmartStage / hand-written",
                            "SmartStage / in-model", "split (measure=False) / in-model",
                            "SmartStage kept (timed split/unsplit)", "tensors per element",
                            "losses = in-model"], rows),
            "", "Steps/s: median (min-max) of the rounds; ratios: median (min-max) of the per-round ratios. The "
            "SmartStage program of a kind is ss.tf2.split(tf.function(model.train_step), raw, measure=True), and "
            "the model's own step on raw batches when the timed split runs slower.", "",
            markdown_table(["kind", "setting", "target", "measured (median, range)", "result"], checks)]


def plot(result: dict[str, Any]):
    """Steps/s of every program, per kind and setting: bars at the median, whiskers to the min and max."""
    from benchmarks.report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    groups = [(STEP_KIND, s) for s in result["settings"]] + [(k, s) for k, ss in result.get("kinds", {}).items()
                                                               for s in ss]
    figure, axis = plt.subplots(figsize=(max(6.0, 1.3 * len(groups)), 4.2))
    width = 0.8 / len(PROGRAMS)
    for j, program in enumerate(PROGRAMS):
        spreads = [s["steps_per_second"][program]["spread"] for _, s in groups]
        xs = [i + (j - (len(PROGRAMS) - 1) / 2) * width for i in range(len(groups))]
        medians = [sp.median for sp in spreads]
        axis.bar(xs, medians, width, label=TITLES[program],
                 yerr=[[m - sp.low for m, sp in zip(medians, spreads)], [sp.high - m for m, sp in zip(medians, spreads)]],
                 capsize=2)
    axis.set_xticks(range(len(groups)))
    labels = [f"{kind}\n" + ("CPU" if s["device_ms"] <= 0 else "device {:g} ms".format(s["device_ms"])) for kind, s in groups]
    axis.set_xticklabels(labels, fontsize=7, rotation=20)
    axis.set_ylabel("steps/s (median, min-max)")
    axis.set_title(f"TF2: in-model vs hand-written map vs SmartStage ({result['mode']} mode)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows and steps")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (the smoke test's)")
    parser.add_argument("--device-ms", type=float, default=5.0, help="the emulated accelerator's ms per step")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--publish", action="store_true",
                        help="also write docs/perf/tf2.{json,md,png} and a dated copy, docs/perf/tf2-<date>.*")
    parser.add_argument("--kinds", default=None,
                        help=f"comma-separated: {STEP_KIND} (the tf.function step) and Keras kinds {', '.join(KINDS)} "
                             f"(default: all; with --smoke, {STEP_KIND} only)")
    parser.add_argument("--grappler-arithmetic", action="store_true",
                        help="keep Grappler's arithmetic optimizer on (the split's losses differ in the last bits)")
    args = parser.parse_args(argv)
    every = ",".join((STEP_KIND, *KINDS))
    args.kinds = args.kinds or (STEP_KIND if args.smoke else every)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k != STEP_KIND and k not in KINDS]
    if unknown:
        parser.error(f"unknown kind {unknown[0]!r}; choose from {STEP_KIND}, {', '.join(KINDS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Without it the same program run twice on this CPU differs in a loss's 8th digit by step 5 (a kernel's
    # threaded reduction order); with it, each program is reproducible and the three compare bit for bit.
    tf.config.experimental.enable_op_determinism()
    if not args.grappler_arithmetic:
        # Grappler's arithmetic optimizer rewrites the in-model step across what becomes the cut (the loss's
        # gradient arithmetic): with it on, the split step's losses differ from the in-model step's in the 8th
        # digit from step 2 to 6. Off for all three programs, they are identical.
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    mode = MODES[mode_name]
    mode = replace(mode, repeats=args.repeats or mode.repeats, steps=args.steps or mode.steps)
    options = Tf2Options(batch_size=args.batch_size or (64 if args.smoke else 256))
    machine = machine_info()
    settings, by_kind = [], {}
    with tempfile.TemporaryDirectory(prefix="smartstage-tf2-bench-") as tmp:
        files = prepare_criteo(tmp, num_rows=mode.rows, seed=0)
        for device_ms in (0.0, args.device_ms):
            for kind in kinds:
                logger.info("measuring %s, %s", kind, _setting_name(device_ms))
                measured = measure(files, on_device(options, device_ms), mode, kind)
                (settings if kind == STEP_KIND else by_kind.setdefault(kind, [])).append(measured)
    result = {
        "benchmark": "tf2", "mode": mode_name, "machine": machine, "options": options,
        "settings_mode": f"{mode.rows} rows, batch {options.batch_size}, {mode.repeats} rounds of {mode.steps} "
                         f"steps per program after {mode.warmup} warm-up steps",
        "command": "python -m benchmarks.tf2" + {"full": "", "quick": " --quick", "smoke": " --smoke"}[mode_name]
                   + ("" if args.kinds == (STEP_KIND if args.smoke else every) else f" --kinds {args.kinds}")
                   + (f" --repeats {args.repeats}" if args.repeats else "")
                   + (f" --steps {args.steps}" if args.steps else ""),
        "check_steps": mode.check_steps, "settings": settings, "kinds": by_kind, "load_average_at_end": load_average(),
        "grappler_arithmetic_optimization": args.grappler_arithmetic, "op_determinism": True,
    }
    text = report_text(result)
    print(text)
    figure = plot(result)
    if figure is None:
        message = "matplotlib is not installed: no plot (pip install -e '.[report]' for it)"
        if args.publish:
            raise SystemExit(f"--publish writes the plot beside the report; {message}")
        logger.warning(message)
    paths = write_outputs(args.out, "tf2", result, figure=figure, publish=args.publish, text=text)
    if args.publish:  # a dated copy beside the current one: docs/perf/tf2-<date>.{json,md,png}
        import shutil

        stamp = time.strftime("%Y-%m-%d")
        for path in paths:
            if path.parent == PUBLISH_DIR:
                shutil.copyfile(path, PUBLISH_DIR / f"tf2-{stamp}{path.suffix}")
    identical = [s["losses_identical"][p] for s in settings for p in PROGRAMS]
    identical += [s["losses_identical"][p] for ss in by_kind.values() for s in ss
                  for p in ("smartstage", "split_untimed")]
    return 0 if all(identical) else 1


if __name__ == "__main__":
    raise SystemExit(main())
