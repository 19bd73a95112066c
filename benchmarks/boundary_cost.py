"""What each boundary tensor costs: a FIFOQueueV2 put + take of k small tensors vs one packed per dtype.

    python -m benchmarks.boundary_cost [--repeats 7] [--steps 400] [--models dlrm,wide_deep]

Two parts, in one process, every measurement interleaved (shuffled order in each repeat) and reported
as the median with the range over repeats, so they compare side by side under the same load:

1. Synthetic: k = 1, 8, 33, 64, 130 tensors of DLRM-like shapes (batch-512 float32/int64/int32
   vectors, int32 scalars and shape vectors), carried by a FIFOQueueV2 as they are (k components) or
   packed: "concat" (Reshape to rank 1 + ConcatV2 per dtype on the put side, SplitV + Reshape on the
   take side) or "stack" (Pack per dtype and shape, Unpack: no Reshape).
   The put and the take run as separate `session.run` calls, as in training (the prefetch thread runs
   the put, the step the take); the table gives microseconds per step for each side and for two empty
   runs (the fixed cost of a session.run), so the queue's own cost is the difference.

2. DLRM-like and Wide&Deep-like: the tensors SmartStage's rewritten stage actually carries on the e2e
   benchmark's CPU workloads (one real batch of them), put + take as they are vs with every numeric tensor
   of fully known shape packed per dtype (what a packing pass could do: strings and tensors whose size
   varies per batch stay as they are), beside a training step of that workload at its defaults
   (`ss.Session` with the flag on). The share of the step (in percent) is (take-side cost) / (step time) for the
   training thread and (put-side cost) / (step time) for the prefetch thread.

3. `--tf2`: the same question in a TF2 split (what the cut-cost rule, smartstage/passes/cut_cost.py, is
   built on): a dataset of batch-512 int64 ids, mapped (AUTOTUNE, deterministic) then prefetched, feeding a
   step that reads the ids and k shape-derived int32 scalars (Shape + StridedSlice of the ids, as a gradient
   needs them). Three ways per k, per element, in microseconds: "carry" (the map computes the k scalars and the
   element carries them: k+1 tensors), "packed" (the same k scalars as one int32[k] tensor, unstacked by the
   step, as split() packs them), "recompute" (the element carries the ids alone, the step computes the k
   scalars), and "no map" (no map at all, the step computes them: the map's own per-element cost is
   no map vs recompute). (carry - recompute) / k is what carrying one small tensor costs beyond recomputing it.

Grappler's meta optimizer is off in the queue-only sessions (the graphs are constants feeding a queue:
it would fold them away); the training step runs with the session's defaults.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

from benchmarks.report import (
    DEFAULT_OUT,
    Spread,
    machine_info,
    machine_line,
    markdown_table,
    write_outputs,
)

KS = (1, 8, 33, 64, 130)
MODES = ("as is", "concat", "stack")
BATCH = 512
# The mix of a DLRM-like cut (dense columns, ids, SparseTensor shapes, slice sizes), cycled to k tensors.
MIX = ((tf.float32, (BATCH,)), (tf.int64, (BATCH,)), (tf.int32, ()), (tf.int32, (2,)),
       (tf.float32, (BATCH, 1)), (tf.int64, (BATCH,)), (tf.int32, (BATCH,)), (tf.int32, (1,)))
PACKABLE = {tf.float32, tf.float64, tf.int32, tf.int64, tf.bool, tf.float16, tf.bfloat16, tf.int8, tf.uint8,
            tf.int16}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _queue_config() -> config_pb2.ConfigProto:
    config = config_pb2.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    config.graph_options.rewrite_options.CopyFrom(rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True))
    return config


def _packable(value: np.ndarray, static_shape: tf.TensorShape) -> bool:
    return tf.as_dtype(value.dtype) in PACKABLE and static_shape.is_fully_defined()


@dataclass
class QueueCase:
    """One buffer carrying `values` (packed per dtype or not) in its own graph and session."""

    name: str
    sess: tf.compat.v1.Session
    put: Any
    take: Any
    empty: Any
    components: int

    @classmethod
    def build(cls, name: str, values: list[np.ndarray], shapes: list[tf.TensorShape], mode: str) -> QueueCase:
        """mode: "as is" (k components), "concat" (one rank-1 tensor per dtype: Reshape + ConcatV2,
        SplitV + Reshape), "stack" (one per dtype and shape: Pack, Unpack; no Reshape on either side)."""
        graph = tf.Graph()
        with graph.as_default():
            sources = [tf.constant(v) for v in values]
            groups: dict[Any, list[int]] = {}
            if mode != "as is":
                for i, (v, s) in enumerate(zip(values, shapes)):
                    if _packable(v, s):
                        key = sources[i].dtype if mode == "concat" else (sources[i].dtype, tuple(s.as_list()))
                        groups.setdefault(key, []).append(i)
                groups = {d: ix for d, ix in groups.items() if len(ix) > 1}
            grouped = {i for ix in groups.values() for i in ix}
            plain = [i for i in range(len(values)) if i not in grouped]
            components = [sources[i] for i in plain]
            for ix in groups.values():
                if mode == "stack":
                    components.append(tf.stack([sources[i] for i in ix]))
                else:
                    components.append(tf.concat([tf.reshape(sources[i], [-1]) for i in ix], 0))
            queue = tf.queue.FIFOQueue(4, [c.dtype for c in components])
            put = queue.enqueue(components)
            taken = queue.dequeue()
            taken = taken if isinstance(taken, (list, tuple)) else [taken]
            outs = list(taken[:len(plain)])
            for ix, packed_tensor in zip(groups.values(), taken[len(plain):]):
                if mode == "stack":
                    outs += tf.unstack(packed_tensor, num=len(ix))
                    continue
                sizes = [int(np.prod(shapes[i].as_list(), dtype=np.int64)) for i in ix]
                parts = tf.split(packed_tensor, sizes, 0)
                outs += [tf.reshape(p, shapes[i]) for p, i in zip(parts, ix)]
            with tf.control_dependencies([o.op for o in outs]):
                take = tf.no_op()
            empty = tf.no_op()
        sess = tf.compat.v1.Session(graph=graph, config=_queue_config())
        return cls(name, sess, sess.make_callable(put), sess.make_callable(take), sess.make_callable(empty),
                   len(components))

    def sample(self, steps: int) -> dict[str, float]:
        """Microseconds per step: the put run, the take run, two empty runs (the session's fixed cost)."""
        for _ in range(10):
            self.put()
            self.take()
        put = take = empty = 0.0
        for _ in range(steps):  # the empty runs interleaved with the queue's, so a load spike hits both
            t0 = time.perf_counter()
            self.put()
            t1 = time.perf_counter()
            self.take()
            t2 = time.perf_counter()
            self.empty()
            self.empty()
            t3 = time.perf_counter()
            put += t1 - t0
            take += t2 - t1
            empty += t3 - t2
        return {"put_us": 1e6 * put / steps, "take_us": 1e6 * take / steps, "empty2_us": 1e6 * empty / steps}

    def close(self) -> None:
        self.sess.close()


def synthetic_values(k: int) -> tuple[list[np.ndarray], list[tf.TensorShape]]:
    rng = np.random.default_rng(k)
    values = []
    for i in range(k):
        dtype, shape = MIX[i % len(MIX)]
        values.append(rng.integers(0, 1000, size=shape).astype(dtype.as_numpy_dtype))
    return values, [tf.TensorShape(v.shape) for v in values]


@dataclass
class WorkloadStep:
    """A workload's smart configuration at its defaults, and one real batch of its cut."""

    run: Any
    values: list[np.ndarray]
    shapes: list[tf.TensorShape]

    @classmethod
    def build(cls, model: str, out_dir: Path, rows: int) -> WorkloadStep:
        from benchmarks.e2e import prepare_data
        from benchmarks.runners import (
            CONFIGS_BY_NAME,
            DEFAULT_SETTING,
            ConfigRunner,
            Workload,
            smart_split,
        )

        files = prepare_data(out_dir, rows, 0)
        workload = Workload(model, "cpu")
        smart = ConfigRunner(CONFIGS_BY_NAME["smart"], workload, files)
        plain = ConfigRunner(CONFIGS_BY_NAME["no_stage"], workload, files)
        names = smart_split(smart)
        tensors = [plain.graph.get_tensor_by_name(n) for n in names]
        with tf.compat.v1.Session(graph=plain.graph) as sess:
            sess.run(plain.model.init_op)
            values = sess.run(tensors)
        values = [np.asarray(v) for v in values]
        return cls(smart.open(DEFAULT_SETTING), values, [t.shape for t in tensors])

    def sample(self, steps: int) -> float:
        return 1e3 * self.run.sample(warmup=5, steps=steps).seconds / steps  # ms per step


TF2_KS = (4, 16, 64)
TF2_WAYS = ("carry", "packed", "recompute", "no map")


def _tf2_program(way: str, k: int, batch: int = BATCH):
    """(dataset iterator, step) for one way of getting k shape scalars of the ids to the step (part 3)."""
    ids = tf.data.Dataset.from_tensors(tf.range(batch, dtype=tf.int64)).repeat()

    def scalars(x):
        shape = tf.shape(x)
        return [shape[j % 1] + j for j in range(k)]  # k distinct StridedSlice + Add ops, as a gradient's shapes

    if way == "carry":
        ds = ids.map(lambda x: (x, *scalars(x)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    elif way == "packed":  # as split() packs them: one int32[k] tensor, unstacked by the step
        ds = ids.map(lambda x: (x, tf.stack(scalars(x))), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    elif way == "recompute":
        ds = ids.map(lambda x: (x,), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        ds = tf.data.Dataset.from_tensors((tf.range(batch, dtype=tf.int64),)).repeat()  # no map function runs
    ds = ds.prefetch(tf.data.AUTOTUNE)
    specs = [tf.TensorSpec(s.shape, s.dtype) for s in tf.nest.flatten(ds.element_spec)]

    def step(x, *carried):
        if way == "packed":
            carried = tf.unstack(carried[0], num=k)
        values = list(carried) if carried else scalars(x)
        return tf.reduce_sum(x) + tf.cast(tf.add_n(values), tf.int64)

    concrete = tf.function(step, autograph=False).get_concrete_function(*specs)
    return iter(ds), concrete


def tf2_sample(program, elements: int) -> float:
    """Microseconds per element: next(iterator), then the step's concrete function on the element."""
    iterator, step = program
    for _ in range(20):
        step(*next(iterator))
    start = time.perf_counter()
    for _ in range(elements):
        out = step(*next(iterator))
    out.numpy()
    return 1e6 * (time.perf_counter() - start) / elements


def measure_tf2(repeats: int, elements: int, ks: Sequence[int] = TF2_KS) -> dict[str, Any]:
    """Part 3 (module docstring): per k, the three ways, interleaved in a shuffled order in each repeat."""
    programs = {(way, k): _tf2_program(way, k) for k in ks for way in TF2_WAYS}
    samples: dict[tuple, list[float]] = {key: [] for key in programs}
    rng = random.Random(1)
    for repeat in range(repeats):
        order = list(programs)
        rng.shuffle(order)
        for key in order:
            samples[key].append(tf2_sample(programs[key], elements))
        _progress(f"tf2 repeat {repeat + 1}/{repeats} done")
    result = {}
    for k in ks:
        carry, packed, recompute, plain = (samples[(w, k)] for w in TF2_WAYS)
        result[k] = {"carry_us": Spread.of(carry), "packed_us": Spread.of(packed), "recompute_us": Spread.of(recompute),
                     "no_map_us": Spread.of(plain),
                     # paired within a repeat: what one carried scalar costs beyond recomputing it
                     "per_tensor_us": Spread.of((c - r) / k for c, r in zip(carry, recompute)),
                     "map_us": Spread.of(r - p for r, p in zip(recompute, plain))}
    return result


def tf2_report_text(result: dict[Any, Any]) -> str:
    rows = [[k, d["carry_us"].text(1), d["packed_us"].text(1), d["recompute_us"].text(1), d["no_map_us"].text(1),
             d["per_tensor_us"].text(2), d["map_us"].text(1)] for k, d in result.items()]
    return ("\nTF2 split, microseconds per element (median (range) over repeats):\n\n"
            + markdown_table(["k shape scalars", "carry (k+1 tensors)", "packed (2 tensors)", "recompute (1 tensor)",
                              "no map",
                              "(carry - recompute) / k", "the map itself (recompute - no map)"], rows) + "\n")


def _summary(samples: list[dict[str, float]]) -> dict[str, Spread]:
    return {key: Spread.of(s[key] for s in samples) for key in ("put_us", "take_us", "empty2_us")}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cases: dict[str, QueueCase] = {}
    for k in args.ks:
        values, shapes = synthetic_values(k)
        for mode in MODES:
            name = f"k={k} {mode}"
            cases[name] = QueueCase.build(name, values, shapes, mode)
    steps: dict[str, WorkloadStep] = {}
    for model in args.models:
        _progress(f"building the {model} workload")
        step = steps[model] = WorkloadStep.build(model, args.out, args.rows)
        for mode in MODES:
            name = f"{model} cut {mode}"
            cases[name] = QueueCase.build(name, step.values, step.shapes, mode)
    samples: dict[str, list] = {name: [] for name in list(cases) + [f"{m} step" for m in steps]}
    rng = random.Random(0)
    try:
        for repeat in range(args.repeats):
            order = list(samples)
            rng.shuffle(order)
            for name in order:
                if name.endswith(" step"):
                    samples[name].append(steps[name.split()[0]].sample(args.train_steps))
                else:
                    samples[name].append(cases[name].sample(args.steps))
            _progress(f"repeat {repeat + 1}/{args.repeats} done")
    finally:
        for case in cases.values():
            case.close()
        for step in steps.values():
            step.run.close()
    result: dict[str, Any] = {"cases": {}}
    for name, case in cases.items():
        result["cases"][name] = dict(components=case.components, **_summary(samples[name]))
        # per repeat: the queue's own cost (put + take - two empty runs), paired within a repeat
        result["cases"][name]["queue_us"] = Spread.of(s["put_us"] + s["take_us"] - s["empty2_us"]
                                                      for s in samples[name])
    result["workloads"] = {}
    for model, workload in steps.items():
        step = samples[f"{model} step"]
        plain = samples[f"{model} cut as is"]
        out = result["workloads"][model] = {
            "step_ms": Spread.of(step), "tensors": len(workload.values),
            "packable": sum(_packable(v, s) for v, s in zip(workload.values, workload.shapes)),
            # The most any packing could save: the whole cost of the buffer beyond two empty session runs.
            "queue_share": Spread.of(0.1 * (a["put_us"] + a["take_us"] - a["empty2_us"]) / t
                                     for a, t in zip(plain, step))}
        for side in ("put_us", "take_us"):
            cost = [a[side] - a["empty2_us"] / 2 for a in plain]
            out[f"{side}_cost_share"] = Spread.of(0.1 * c / t for c, t in zip(cost, step))
            for mode in MODES[1:]:
                saved = [a[side] - b[side] for a, b in zip(plain, samples[f"{model} cut {mode}"])]
                out[f"{side}_saved_{mode}"] = Spread.of(saved)
                out[f"{side}_saved_share_{mode}"] = Spread.of(0.1 * s / t for s, t in zip(saved, step))
    return result


def report_text(result: dict[str, Any], command: str) -> str:
    lines = [f"# Boundary tensors: what each costs ({command})", f"Machine: {machine_line(result['machine'])}", "",
             "Microseconds per step, median (range) over repeats; `queue` = put run + take run - two empty runs.", ""]
    rows = []
    for name, c in result["cases"].items():
        rows.append([name, c["components"], c["put_us"].text(1), c["take_us"].text(1), c["empty2_us"].text(1),
                     c["queue_us"].text(1)])
    lines.append(markdown_table(["buffer", "components", "put run (us)", "take run (us)", "2 empty runs (us)",
                                 "queue (us)"], rows))
    for model, d in result.get("workloads", {}).items():
        lines += ["", (f"{model} (smart, defaults): step {d['step_ms'].text(2)} ms; the cut carries {d['tensors']} "
                       f"tensors, {d['packable']} packable (numeric, fully known shape)."),
                  (f"- the whole buffer (put + take beyond two empty runs) is {d['queue_share'].text(2)}% of a step: "
                   "the most any packing could save")]
        for side, label in (("take_us", "take side (training thread)"), ("put_us", "put side (prefetch thread)")):
            saved = "; ".join(f"{mode} saves {d[f'{side}_saved_{mode}'].text(1)} us = "
                              f"{d[f'{side}_saved_share_{mode}'].text(2)}% of a step" for mode in MODES[1:])
            lines.append(f"- {label}: the run (less one empty run) is {d[f'{side}_cost_share'].text(2)}% of a step; "
                         f"{saved}")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.boundary_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400, help="put + take runs per block")
    parser.add_argument("--train-steps", type=int, default=40, help="training steps per block (the workloads)")
    parser.add_argument("--rows", type=int, default=200_000, help="generated rows for the workloads (the e2e default)")
    parser.add_argument("--ks", type=lambda s: tuple(int(x) for x in s.split(",")), default=KS)
    parser.add_argument("--models", type=lambda s: tuple(m for m in s.split(",") if m), default=("dlrm", "wide_deep"),
                        help="workloads whose real cut is measured beside their step (comma-separated; '' for none)")
    parser.add_argument("--tf2", action="store_true",
                        help="only part 3: carrying vs recomputing small shape tensors in a TF2 split (eager)")
    parser.add_argument("--elements", type=int, default=2000, help="elements per block in --tf2")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.tf2:
        text = tf2_report_text(measure_tf2(args.repeats, args.elements))
        print(text, end="")
        return 0
    tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    machine = machine_info()
    result = measure(args)
    result["machine"] = machine
    command = "python -m benchmarks.boundary_cost " + " ".join(argv if argv is not None else sys.argv[1:])
    result["command"] = command
    text = report_text(result, command.strip())
    paths = write_outputs(args.out, "boundary_cost", result, text=text)
    print(text, end="")
    print(f"\nWrote: {', '.join(str(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
