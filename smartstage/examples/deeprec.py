"""DeepRec's SmartStage documentation example (docs/Stage.md, docs/Smart-Stage.md), on stock TensorFlow.

    TextLineReader.read -> train.batch -> decode_csv -> stage([v0, v1])
        v0 -> string_to_hash_bucket -> embedding_lookup(var) -> as_string --\\
        v1 -> concat(v1, ['xxx']) --------------------------------------------> concat -> target

The node structure follows the original line by line; what differs is only the spelling of the
TF1 names on TF2 (`tf.compat.v1...`), `shuffle=False` on the filename producer (one file either
way, but no RandomShuffle), and the stage, which is `stage_fn` instead of `tf.staged`. With
SmartStage, `string_to_hash_bucket` and the concat with the constant move to the prefetch side;
the embedding lookup (it reads `var`) and the final concat (the target) stay on the main side.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from smartstage.examples.graph_mode import builds_a_v1_graph
from smartstage.examples.options import StageFn, no_stage


@builds_a_v1_graph
def deeprec_smart_stage_example(
    data_path: str,
    stage_fn: StageFn = no_stage,
    *,
    mark_target: Optional[Callable[[Sequence[tf.Tensor]], None]] = None,
    use_resource: bool = False,
) -> tf.Tensor:
    """Builds DeepRec's example into the default graph (eager mode: a new one, target.graph); returns `target`
    ([4, 3] strings).

        target = deeprec_smart_stage_example(write_deeprec_example_data(path), staged)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[...]) as sess:
            sess.run([target])

    `mark_target` stands for DeepRec's `tf.train.mark_target_node` (called as `mark_target([target])`);
    `use_resource=False` keeps the TF1 reference variable of the original.
    """
    files = tf.compat.v1.train.string_input_producer([data_path], shuffle=False)
    _, line = tf.compat.v1.TextLineReader().read(files)
    table = tf.compat.v1.get_variable("var", shape=[100, 3], initializer=tf.compat.v1.ones_initializer(),
                                      use_resource=use_resource)
    lines = tf.compat.v1.train.batch([line], batch_size=2, capacity=60)
    user, item = tf.io.decode_csv(lines, record_defaults=[[""], [""]], field_delim=",")
    staged = list(stage_fn([user, item]))

    ids = tf.compat.v1.string_to_hash_bucket(staged[0], num_buckets=10)
    rows = tf.nn.embedding_lookup(table, ids)
    items = tf.concat([staged[1], ["xxx"]], axis=0)
    target = tf.concat([tf.as_string(rows), [items, items]], 0)

    if mark_target is not None:
        mark_target([target])
    return target
