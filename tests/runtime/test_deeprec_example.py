"""DeepRec's Stage example (docs/Stage.md) runs on stock TensorFlow with only its imports changed.

Changed: `import tensorflow as tf` -> `import tensorflow.compat.v1 as tf`, and tf.staged,
tf.make_prefetch_hook, tf.train.mark_target_node -> ss.staged, ss.make_prefetch_hook,
ss.mark_target_node. The example reads '1.txt' from the working directory; the test writes it
into tmp_path and runs there.
"""

from __future__ import annotations

import tensorflow.compat.v1 as tf

import smartstage.runtime as ss


def deeprec_stage_example():
    # ---- the example, verbatim but for the imports above ----
    filename_queue = tf.train.string_input_producer(['1.txt'])
    reader = tf.TextLineReader()
    k, v = reader.read(filename_queue)

    var = tf.get_variable("var", shape=[100, 3], initializer=tf.ones_initializer())
    v = tf.train.batch([v], batch_size=2, capacity=20 * 3)
    v0, v1 = tf.decode_csv(v, record_defaults=[[''], ['']], field_delim=',')
    xx = ss.staged([v0, v1])

    xx[0]=tf.string_to_hash_bucket(xx[0],num_buckets=10)
    xx[0] = tf.nn.embedding_lookup(var, xx[0])
    xx[1]=tf.concat([xx[1], ['xxx']], axis = 0)
    target = tf.concat([tf.as_string(xx[0]), [xx[1], xx[1]]], 0)

    # mark target 节点
    ss.mark_target_node([target])

    with tf.train.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()]) as sess:
      for i in range(5):
          print(sess.run([target]))
    # ---- end of the example ----
    return target


def test_deeprec_stage_example_runs(graph, tmp_path, monkeypatch, capsys):
    (tmp_path / "1.txt").write_text("".join(f"user{i},item{i}\n" for i in range(7)))
    monkeypatch.chdir(tmp_path)
    target = deeprec_stage_example()
    printed = capsys.readouterr().out
    assert printed.count("xxx") == 10            # 5 steps, the 'xxx' row twice each
    assert printed.count("1.000000") == 5 * 6    # the looked-up rows of ones, as strings
    assert ss.target_node_names(graph) == [target.op.name]
    (stage,) = ss.stage_defs(graph)
    assert stage.boundary_tensors == ["DecodeCSV:0", "DecodeCSV:1"]
