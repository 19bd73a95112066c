"""A training job for the restore tests: trains on records that carry their ids, checkpoints the iterator.

    python -m tests.runtime.restore_job --mode off --threads 4 --capacity 40 --dir D --phase kill
        trains, checkpoints every --save-steps steps (the iterator's position in SAVEABLE_OBJECTS), and
        SIGKILLs itself --kill-after steps after the first checkpoint past --kill-at-step
    python -m tests.runtime.restore_job --mode off --threads 4 --capacity 40 --dir D --phase resume
        restores the latest checkpoint and trains to the end of input
    --session stock: the same job in a stock tf.compat.v1.train.MonitoredTrainingSession with
        make_prefetch_hook() (no SmartStage config), instead of smartstage.MonitoredTrainingSession

Each step appends "<phase> <global step> <ids...>" to D/steps.log (flushed and fsynced before the next
step), the ids being what the step's own fetches carried: the record ids of the batch the model trained
on. A record is trained exactly once when it appears once among the kill phase's steps up to the
restored global step plus the resume phase's steps (tests/runtime/test_restore_exact.py counts them).

The graph (the read-only StaticHashTable lookup and the hashing are the stage's body, among the ops a
fold or a rewrite moves):

    range(N) -> map(record) -> batch ==iterator==> GetNext -> [lookup(table), hash, scale] -> loss(w) -> train
                                                                  ^ staged() before these (on) or after (off)

modes:
    prefetch  no stage: dataset.map(body, deterministic).prefetch(capacity): stock tf.data, the reference
    off       staged(body(get_next)), the flag off: what the user put before staged() is the stage's body
    on        staged(get_next), body after it, the flag on: the rewrite moves the body behind the stage
"""

from __future__ import annotations

import argparse
import os
import sys

import tensorflow as tf

from tests.runtime.restore_counts import StepLog, add_job_arguments

VOCABULARY = ["a", "b", "c", "d", "e", "f", "g"]


def _records(n: int) -> tf.data.Dataset:
    def record(i):
        category = tf.gather(tf.constant(VOCABULARY), i % len(VOCABULARY))
        return {"id": i, "category": category, "value": tf.cast(i % 5, tf.float32) + 1.0}

    return tf.data.Dataset.range(n).map(record)


def _body(batch: dict, table) -> dict:
    """The preprocessing: pure functions of the batch and a read-only table."""
    return {
        "id": tf.identity(batch["id"], name="ids"),
        "index": table.lookup(batch["category"]),
        "bucket": tf.strings.to_hash_bucket_fast(batch["category"], 16),
        "value": batch["value"] * 0.5,
    }


def _saveable(iterator):
    """The iterator's position as a saveable whose restore initializes the iterator first (TensorFlow
    restores only an initialized iterator, and MonitoredTrainingSession restores before local_init_op)."""
    saveable = tf.data.experimental.make_saveable_from_iterator(iterator)
    restore = saveable.restore

    def initialized_restore(restored_tensors, restored_shapes):
        with tf.control_dependencies([iterator.initializer]):
            return restore(restored_tensors, restored_shapes)

    saveable.restore = initialized_restore
    return saveable


def build(args):
    """The training graph; returns (the ids a step trained on, the global step after it, the iterator)."""
    import smartstage as ss

    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(VOCABULARY), tf.range(len(VOCABULARY), dtype=tf.int64)),
        default_value=0, name="vocabulary")
    dataset = _records(args.records)
    threads = ss.AUTOTUNE if args.threads == 0 else args.threads
    if args.mode == "prefetch":
        dataset = dataset.batch(args.batch).map(
            lambda b: _body(b, table), num_parallel_calls=args.threads or tf.data.AUTOTUNE, deterministic=True)
        dataset = dataset.prefetch(args.capacity)
    else:
        dataset = dataset.batch(args.batch)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, _saveable(iterator))
    batch = iterator.get_next()
    if args.mode == "prefetch":
        features = batch
    elif args.mode == "off":
        features = ss.staged(_body(batch, table), capacity=args.capacity, num_threads=threads)
    else:
        features = _body(ss.staged(batch, capacity=args.capacity, num_threads=threads), table)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    weights = tf.compat.v1.get_variable("w", [len(VOCABULARY)], initializer=tf.compat.v1.zeros_initializer())
    buckets = tf.compat.v1.get_variable("v", [16], initializer=tf.compat.v1.zeros_initializer())
    score = tf.gather(weights, features["index"]) + tf.gather(buckets, features["bucket"])
    loss = tf.reduce_mean(tf.square(score - features["value"]))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
    # The ids the step trained on: a fetch computed on the main side from the same batch as the loss.
    with tf.control_dependencies([train_op]):
        trained_ids = tf.identity(features["id"], name="trained_ids")
        step = tf.identity(global_step.read_value(), name="step_after")
    return trained_ids, step, iterator


def _config(args) -> tf.compat.v1.ConfigProto:
    """A stock ConfigProto with a SmartStage entry: do_smart_stage for mode "on", tf_data_stage when given."""
    config = tf.compat.v1.ConfigProto()
    custom = config.graph_options.rewrite_options.custom_optimizers.add()
    custom.name = "SmartStage"
    custom.parameter_map["do_smart_stage"].b = args.mode == "on"
    if args.tf_data_stage:
        custom.parameter_map["tf_data_stage"].s = args.tf_data_stage.encode()
    return config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["prefetch", "off", "on"], required=True)
    add_job_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="num_threads (0: AUTOTUNE)")
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--tf-data-stage", default="", help="SmartStageOptions.tf_data_stage ('' = default)")
    parser.add_argument("--session", choices=["smartstage", "stock"], default="smartstage",
                        help="smartstage.MonitoredTrainingSession, or the stock one with make_prefetch_hook()")
    args = parser.parse_args(argv)

    import smartstage as ss

    tf.compat.v1.disable_eager_execution()
    trained_ids, step_after, iterator = build(args)
    scaffold = tf.compat.v1.train.Scaffold(
        # The iterator starts at record 0 only in a fresh job: a restore sets its position (local_init_op
        # runs after the restore and would rewind it).
        init_op=tf.group(tf.compat.v1.global_variables_initializer(), iterator.initializer),
        local_init_op=tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer()))
    if args.session == "stock":
        hooks = [ss.make_prefetch_hook(tf_data_stage=args.tf_data_stage or "fold")]
        session, config = tf.compat.v1.train.MonitoredTrainingSession, None
    else:
        hooks = [] if args.mode == "prefetch" else [ss.make_prefetch_hook()]
        session, config = ss.MonitoredTrainingSession, _config(args)
    log = StepLog(args)
    with session(checkpoint_dir=os.path.join(args.dir, "ckpt"), scaffold=scaffold, hooks=hooks, config=config,
                 save_checkpoint_steps=args.save_steps, save_checkpoint_secs=None, save_summaries_steps=None,
                 save_summaries_secs=None, log_step_count_steps=None) as sess:
        while not sess.should_stop():
            ids, step = sess.run([trained_ids, step_after])
            log.record(step, ids)  # the checkpoint hook saves every --save-steps steps
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
