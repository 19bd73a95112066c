"""What the step pays to read one batch: a folded stage's iterator read against the lanes' queue dequeue.

    python -m benchmarks.read_cost                      # 26 string tensors of [512], as Wide&Deep's stage
    python -m benchmarks.read_cost --tensors 8 --dtype int64

A folded stage's step reads its batch with IteratorGetNext from the dataset's prefetch buffer; a stage on
lanes dequeues it from a FIFOQueue its threads keep filled. Both are on the step's critical path, so when the
step sets the pace (a long device step, a free core for the input) the difference is the whole difference
between the two. Both sources here hold ready batches (the dataset repeats one cached element, the queue is
refilled between timed blocks), and each timed run fetches one entry of the read's first tensor, so what is
timed is the session run around one read. Interleaved blocks, the median and range per read, and the
difference of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

BLOCK = 200  # reads per timed block


def _element(tensors: int, batch: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if dtype == "string":
        return [np.array([f"v{x}" for x in rng.integers(0, 1000, batch)]).astype(object) for _ in range(tensors)]
    return [rng.integers(0, 1000, batch).astype(dtype) for _ in range(tensors)]


def measure(tensors: int, batch: int, dtype: str, repeats: int) -> dict[str, list[float]]:
    """Microseconds per read, per block, for the iterator read and the queue dequeue."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    element = _element(tensors, batch, dtype)
    graph = tf.Graph()
    with graph.as_default():
        dataset = tf.data.Dataset.from_tensors(tuple(element)).cache().repeat().prefetch(tf.data.AUTOTUNE)
        read = tf1.data.make_one_shot_iterator(dataset).get_next()
        queue = tf1.FIFOQueue(BLOCK + 8, [t.dtype for t in read], shapes=[t.shape for t in read])
        enqueue = queue.enqueue(read)
        dequeue = queue.dequeue()
        # a value of the read (its first tensor's first entry): a size or shape of a static shape is folded
        # to a constant by Grappler, and the read would not run at all
        fetches = {"iterator read": read[0][0], "queue dequeue": dequeue[0][0]}
    times: dict[str, list[float]] = {name: [] for name in fetches}
    with tf1.Session(graph=graph) as session:
        for _ in range(BLOCK):
            session.run(enqueue)
        for name, fetch in fetches.items():  # warm: each fetch list builds its executor once
            session.run(fetch)
        session.run(enqueue)
        for repeat in range(repeats):
            for name in (list(fetches) if repeat % 2 == 0 else list(reversed(fetches))):
                start = time.perf_counter()
                for _ in range(BLOCK):
                    session.run(fetches[name])
                times[name].append((time.perf_counter() - start) / BLOCK * 1e6)
                if name == "queue dequeue":
                    for _ in range(BLOCK):
                        session.run(enqueue)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=26)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dtype", default="string", choices=("string", "int64", "float32", "int32"))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    times = measure(args.tensors, args.batch, args.dtype, args.repeats)
    print(f"{args.tensors} {args.dtype} tensors of [{args.batch}], {args.repeats} interleaved blocks of {BLOCK} "
          "session runs; microseconds per read, median (min-max):")
    for name, values in times.items():
        print(f"  {name}: {statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})")
    gap = statistics.median(times["iterator read"]) - statistics.median(times["queue dequeue"])
    print(f"  the iterator read costs {gap:.0f} us more a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
