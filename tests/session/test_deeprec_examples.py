"""DeepRec's two documentation examples run on stock TensorFlow, with only their import changed.

The scripts below follow docs/Stage.md and docs/Smart-Stage.md of DeepRec-AI/DeepRec call for
call, in DeepRec's spelling (`tf.staged`, `tf.make_prefetch_hook`, `tf.train.mark_target_node`,
`config.graph_options.optimizer_options.do_smart_stage`); the one change is the first line,
`from smartstage.compat import tf` instead of `import tensorflow as tf` (the compat `tf.ConfigProto`
is ss.ConfigProto, so the config line stays). Each runs in a fresh graph; what it prints is
captured and compared with the same script on the unoptimized graph, step by step.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import tensorflow as tf

from smartstage.examples.data import write_deeprec_example_data

STAGE_SCRIPT = """
from smartstage.compat import tf          # DeepRec: import tensorflow as tf

filename_queue = tf.train.string_input_producer(['1.txt'])
reader = tf.TextLineReader()
k, v = reader.read(filename_queue)

var = tf.get_variable("var", shape=[100, 3], initializer=tf.ones_initializer())
v = tf.train.batch([v], batch_size=2, capacity=20 * 3)
v0, v1 = tf.decode_csv(v, record_defaults=[[''], ['']], field_delim=',')
xx = tf.staged([v0, v1])

xx[0] = tf.string_to_hash_bucket(xx[0], num_buckets=10)
xx[0] = tf.nn.embedding_lookup(var, xx[0])
xx[1] = tf.concat([xx[1], ['xxx']], axis=0)
target = tf.concat([tf.as_string(xx[0]), [xx[1], xx[1]]], 0)

tf.train.mark_target_node([target])

with tf.train.MonitoredTrainingSession(hooks=[tf.make_prefetch_hook()]) as sess:
    for i in range(5):
        print(sess.run([target]))
"""

SMART_STAGE_SCRIPT = """
from smartstage.compat import tf          # DeepRec: import tensorflow as tf

filename_queue = tf.train.string_input_producer(['1.txt'])
reader = tf.TextLineReader()
k, v = reader.read(filename_queue)

var = tf.get_variable("var", shape=[100, 3], initializer=tf.ones_initializer())
v = tf.train.batch([v], batch_size=2, capacity=20 * 3)
v0, v1 = tf.decode_csv(v, record_defaults=[[''], ['']], field_delim=',')
xx = tf.staged([v0, v1])

xx[0] = tf.string_to_hash_bucket(xx[0], num_buckets=10)
xx[0] = tf.nn.embedding_lookup(var, xx[0])
xx[1] = tf.concat([xx[1], ['xxx']], axis=0)
target = tf.concat([tf.as_string(xx[0]), [xx[1], xx[1]]], 0)

config = tf.ConfigProto()
config.graph_options.optimizer_options.do_smart_stage = True
tf.train.mark_target_node([target])

with tf.train.MonitoredTrainingSession(config=config,
                                       hooks=[tf.make_prefetch_hook()]) as sess:
    for i in range(5):
        print(sess.run([target]))
"""

FLAG_LINE = "config.graph_options.optimizer_options.do_smart_stage = True"

MONITORED_ENDING = """with tf.train.MonitoredTrainingSession(config=config,
                                       hooks=[tf.make_prefetch_hook()]) as sess:
    for i in range(5):
        print(sess.run([target]))
"""

# The same script for a user without MonitoredTrainingSession: tf.Session (= ss.Session) runs the
# prefetch threads itself; the queue runners of train.batch are the user's, as in any TF1 script.
PLAIN_ENDING = """init = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
with tf.Session(config=config) as sess:
    sess.run(init)
    coord = tf.train.Coordinator()
    threads = tf.train.start_queue_runners(sess=sess, coord=coord)
    for i in range(5):
        print(sess.run([target]))
    coord.request_stop()
    coord.join(threads, stop_grace_period_secs=10)
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    return write_deeprec_example_data(tmp_path_factory.mktemp("deeprec") / "1.txt")


def run_script(script: str, data_file: str) -> tuple[list[str], dict]:
    """Runs `script` in a fresh default graph; returns the lines it printed (one per step) and its names."""
    out = io.StringIO()
    names = {"__name__": "__main__"}
    with tf.Graph().as_default(), contextlib.redirect_stdout(out):
        exec(compile(script.replace("'1.txt'", repr(data_file)), "deeprec_example.py", "exec"), names)  # noqa: S102
    steps = [chunk for chunk in out.getvalue().split("[array(") if chunk.strip()]
    return steps, names


def unstaged(script: str) -> str:
    """The same script without a stage at all: the values every staged run must print."""
    return (script.replace("xx = tf.staged([v0, v1])", "xx = [v0, v1]")
            .replace("hooks=[tf.make_prefetch_hook()]", "hooks=[]").replace(FLAG_LINE, ""))


def test_stage_example_prints_the_values_of_the_unstaged_graph(data_file):
    printed, names = run_script(STAGE_SCRIPT, data_file)
    reference, _ = run_script(unstaged(STAGE_SCRIPT), data_file)
    assert len(printed) == 5
    assert printed == reference
    assert "value0" in printed[0] and "xxx" in printed[0]
    assert names["sess"].smart_stage is None          # no flag: the graph is left as built


def test_smart_stage_example_prints_the_values_of_the_unoptimized_graph(data_file):
    optimized, names = run_script(SMART_STAGE_SCRIPT, data_file)
    unoptimized, plain_names = run_script(SMART_STAGE_SCRIPT.replace(FLAG_LINE, ""), data_file)
    reference, _ = run_script(unstaged(SMART_STAGE_SCRIPT), data_file)
    assert len(optimized) == 5
    assert optimized == unoptimized == reference
    record = names["sess"].smart_stage
    assert record is not None and record.changed
    (stage,) = record.stages
    moved_types = {names["target"].graph.get_operation_by_name(n).type for n in stage.moved}
    assert {"StringToHashBucket", "ConcatV2"} <= moved_types
    assert plain_names["sess"].smart_stage is None


def test_smart_stage_example_on_a_plain_session_prints_the_same_values(data_file):
    script = SMART_STAGE_SCRIPT.replace(MONITORED_ENDING, PLAIN_ENDING)
    assert script != SMART_STAGE_SCRIPT
    optimized, names = run_script(script, data_file)
    reference, _ = run_script(unstaged(SMART_STAGE_SCRIPT), data_file)
    assert len(optimized) == 5 and optimized == reference
    assert names["sess"].smart_stage.changed


def test_the_compat_namespace_is_deeprecs_api_on_tf_compat_v1():
    from smartstage import compat
    import smartstage as ss

    assert compat.tf.staged is ss.staged and compat.tf.make_prefetch_hook is ss.make_prefetch_hook
    assert compat.tf.ConfigProto is ss.ConfigProto and compat.tf.Session is ss.Session
    assert compat.tf.train.MonitoredTrainingSession is ss.MonitoredTrainingSession
    assert compat.tf.train.mark_target_node is ss.mark_target_node
    assert compat.tf.decode_csv is tf.compat.v1.decode_csv
    assert compat.tf.train.batch is tf.compat.v1.train.batch
