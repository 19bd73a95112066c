"""How to build the main side of a split TF2 step: the stock ways, measured side by side.

    python -m benchmarks.tf2_build_ways            # 5 interleaved repeats, 200 steps each
    python -m benchmarks.tf2_build_ways --quick    # 3 repeats, 50 steps

  import    smartstage.tf2's way: the main side's GraphDef (cut by edit records) imported into a tf.function
            with an input_map (boundary placeholders -> arguments, captures -> the user's handles), called
            through its concrete function as split() calls it
  prune     tf.compat.v1.wrap_function(import of the whole step graph).prune(boundary tensors, outputs):
            the stock pruner lifts the part between the boundary and the outputs into a new function
Both run a DLRM-like step's main side on the same precomputed boundary batches; reported per way: the
build time (construct + first call) and steps/s (median and range over repeats, rounds interleaved), and
whether the losses are bit-identical to the unsplit step. `function_def_to_graph` is not timed: it gives a
FuncGraph, and making a callable of one needs private constructors (ConcreteFunction(graph)).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tensorflow as tf

from smartstage.tf2.step import split as split_step
from smartstage.tf2.step.functions import IMPORT_SCOPE, main_function

VOCAB = [f"u{i}" for i in range(50)]


def program(batch_size: int = 256):
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(VOCAB), tf.range(len(VOCAB), dtype=tf.int64)), default_value=len(VOCAB))
    emb = tf.Variable(tf.random.stateless_normal([len(VOCAB) + 1 + 64 + 8, 16], seed=[1, 2]))
    dense = tf.Variable(tf.random.stateless_normal([48, 1], seed=[3, 4]) * 0.1)
    opt = tf.keras.optimizers.Adam(0.01)
    opt.build([emb, dense])  # its slots exist before the snapshot

    @tf.function
    def step(batch):
        user = table.lookup(batch["user"])
        tags = tf.strings.to_hash_bucket_fast(tf.strings.split(batch["tags"], "|"), 64) + len(VOCAB) + 1
        bucket = tf.cast(tf.raw_ops.Bucketize(input=batch["price"], boundaries=[1.0, 2.0, 3.0, 5.0]), tf.int64)
        with tf.GradientTape() as tape:
            x = tf.concat([tf.nn.embedding_lookup(emb, user),
                           tf.reduce_sum(tf.nn.embedding_lookup(emb, tags.to_tensor()), 1),
                           tf.nn.embedding_lookup(emb, bucket + len(VOCAB) + 65)], 1)
            loss = tf.reduce_mean(tf.square(tf.matmul(x, dense)[:, 0] - batch["label"]))
        grads = tape.gradient(loss, [emb, dense])
        opt.apply_gradients(zip(grads, [emb, dense]))
        return loss

    rng = np.random.default_rng(0)
    n = batch_size * 64
    data = {"user": rng.choice(VOCAB + ["x"], n),
            "tags": np.array(["|".join(f"t{j}" for j in rng.integers(0, 30, 3)) for _ in range(n)]),
            "price": rng.uniform(0, 6, n).astype(np.float32), "label": rng.uniform(size=n).astype(np.float32)}
    return step, [emb, dense] + list(opt.variables), tf.data.Dataset.from_tensor_slices(data).batch(batch_size)


def pruned_main(split):
    """The main side by the stock pruner: the whole step graph imported into a wrap_function, then pruned."""
    traced = split.traced
    captures = {f"{c.placeholder}:0": c.external for c in traced.captures}

    def whole_step():
        graph = tf.compat.v1.get_default_graph()
        tf.graph_util.import_graph_def(traced.graph_def, input_map={k: graph.capture(v) for k, v in captures.items()},
                                       name=IMPORT_SCOPE)

    wrapped = tf.compat.v1.wrap_function(whole_step, [])
    graph = wrapped.graph
    effects = [graph.get_operation_by_name(f"{IMPORT_SCOPE}/{op}") for op in traced.control_outputs
               if op not in split.moved and op not in traced.inputs]
    feeds = [graph.get_tensor_by_name(f"{IMPORT_SCOPE}/{t}") for t in split.boundary]
    fetches = [graph.get_tensor_by_name(f"{IMPORT_SCOPE}/{t}") for t in traced.outputs]
    return wrapped.prune(feeds, fetches + effects)


def _time(fn, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        fn(*batch)
    return len(batches) / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats, steps = (3, 50) if args.quick else (5, 200)

    step, variables, ds = program()
    snapshot = [v.numpy() for v in variables]
    expected = [float(step(b)) for b in ds.take(8)]
    for v, value in zip(variables, snapshot):
        v.assign(value)
    split = split_step(step, ds)
    boundary = [tuple(b) for b in split.dataset.take(64)]
    boundary = (boundary * (steps // len(boundary) + 1))[:steps]

    builds, mains = {}, {}
    start = time.perf_counter()
    mains["import"] = main_function(split.sides, split.traced, None).get_concrete_function()  # as split() calls it
    mains["import"](*boundary[0])
    builds["import"] = time.perf_counter() - start
    start = time.perf_counter()
    pruned = pruned_main(split)
    mains["prune"] = lambda *b: pruned(*b)[0]
    mains["prune"](*boundary[0])
    builds["prune"] = time.perf_counter() - start

    same = {}
    for way, fn in mains.items():
        for v, value in zip(variables, snapshot):
            v.assign(value)
        same[way] = [float(fn(*b)) for b in boundary[:8]] == expected
    rates = {way: [] for way in mains}
    for r in range(repeats):
        for way in (list(mains) if r % 2 == 0 else list(mains)[::-1]):
            rates[way].append(_time(mains[way], boundary))
    print(f"{'way':8} {'build s':>8} {'steps/s median':>15} {'range':>17} {'losses identical':>17}")
    for way in mains:
        med = statistics.median(rates[way])
        print(f"{way:8} {builds[way]:8.2f} {med:15.1f} {min(rates[way]):8.1f}-{max(rates[way]):<8.1f} {str(same[way]):>17}")
    ratio = [a / b for a, b in zip(rates["import"], rates["prune"])]
    print(f"import / prune steps/s per round: median {statistics.median(ratio):.3f} "
          f"(range {min(ratio):.3f}-{max(ratio):.3f})")


if __name__ == "__main__":
    main()
