"""A TF2 custom training loop on a split step, for the restore test: checkpoints the split dataset's iterator.

    python -m tests.tf2.restore_loop --dir D --threads 4 --phase kill     # SIGKILLs itself after a checkpoint
    python -m tests.tf2.restore_loop --dir D --threads 4 --phase resume   # restores it, trains to the end

The loop a user writes to save its input position the tf.data way, on ss.tf2.split's halves:

    split = ss.tf2.split(train_step, dataset, num_threads=threads)
    iterator = iter(split.dataset)
    checkpoint = tf.train.Checkpoint(iterator=iterator, weights=weights, step=step)

The step's preprocessing (a read-only StaticHashTable lookup, hashing, scaling: tests/runtime/restore_job.py's
body) moves into the map. Each step appends "<phase> <step> <ids...>" to D/steps.log (fsynced before the next
step), the ids being the record ids the split step returned for its batch; tests/runtime/restore_counts.count
counts them.
"""

from __future__ import annotations

import argparse
import os
import sys

import tensorflow as tf

from tests.runtime.restore_counts import StepLog, add_job_arguments
from tests.runtime.restore_job import VOCABULARY, _body, _records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="the map's threads (split(num_threads=))")
    args = parser.parse_args(argv)

    import smartstage as ss

    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(VOCABULARY), tf.range(len(VOCABULARY), dtype=tf.int64)), default_value=-1)
    weights = tf.Variable(tf.zeros([16]), name="weights")
    step_count = tf.Variable(0, dtype=tf.int64, name="step")

    @tf.function
    def train_step(batch):
        features = _body(batch, table)
        loss = tf.reduce_sum(tf.gather(weights, features["bucket"]) * features["value"]) + tf.reduce_sum(
            tf.cast(features["index"], tf.float32))
        weights.assign_sub(0.01 * tf.ones([16]))
        return {"ids": features["id"], "loss": loss}

    dataset = _records(args.records).batch(args.batch)
    split = ss.tf2.split(train_step, dataset, num_threads=args.threads, state=[table])
    assert split.moved, "the preprocessing must move into the map for this test to test it"
    iterator = iter(split.dataset)
    checkpoint = tf.train.Checkpoint(iterator=iterator, weights=weights, step=step_count)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(args.dir, "ckpt"), max_to_keep=3)
    if args.phase == "resume":
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    log = StepLog(args)
    for element in iterator:
        out = split.step(element)
        step = int(step_count.assign_add(1).numpy())
        if step % args.save_steps == 0:
            manager.save()
        log.record(step, out["ids"].numpy())
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
