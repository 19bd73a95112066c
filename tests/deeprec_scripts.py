"""DeepRec-style training scripts, written for these tests against DeepRec's public API names.

They use what DeepRec's Stage and SmartStage documentation examples use, call for call: a text-line
reader on '1.txt', `tf.train.batch`, `tf.decode_csv`, `tf.staged`, `tf.string_to_hash_bucket`, an
embedding lookup on a variable, a concat with a constant, `tf.as_string`, `tf.train.mark_target_node`,
`config.graph_options.optimizer_options.do_smart_stage` and `tf.make_prefetch_hook()`. The only line a
DeepRec user changes is the import: `from smartstage.compat import tf`.
"""

from __future__ import annotations

import contextlib
import io

import tensorflow as tf

_BODY = """
from smartstage.compat import tf          # on DeepRec: import tensorflow as tf

files = tf.train.string_input_producer(['1.txt'])
_, line = tf.TextLineReader().read(files)
table = tf.get_variable("var", shape=[100, 3], initializer=tf.ones_initializer())
lines = tf.train.batch([line], batch_size=2, capacity=60)
user, item = tf.decode_csv(lines, record_defaults=[[''], ['']], field_delim=',')
staged = tf.staged([user, item])

ids = tf.string_to_hash_bucket(staged[0], num_buckets=10)
rows = tf.nn.embedding_lookup(table, ids)
items = tf.concat([staged[1], ['xxx']], axis=0)
target = tf.concat([tf.as_string(rows), [items, items]], 0)
"""

STAGE_SCRIPT = _BODY + """
tf.train.mark_target_node([target])
with tf.train.MonitoredTrainingSession(hooks=[tf.make_prefetch_hook()]) as sess:
    for step in range(5):
        print(sess.run([target]))
"""

FLAG_LINE = "config.graph_options.optimizer_options.do_smart_stage = True"

MONITORED_ENDING = """with tf.train.MonitoredTrainingSession(config=config, hooks=[tf.make_prefetch_hook()]) as sess:
    for step in range(5):
        print(sess.run([target]))
"""

SMART_STAGE_SCRIPT = _BODY + f"""
config = tf.ConfigProto()
{FLAG_LINE}
tf.train.mark_target_node([target])
""" + MONITORED_ENDING

# The same script for a user without MonitoredTrainingSession: tf.Session (= ss.Session) runs the
# prefetch threads itself; the queue runners of train.batch are the user's, as in any TF1 script.
PLAIN_ENDING = """init = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
with tf.Session(config=config) as sess:
    sess.run(init)
    coord = tf.train.Coordinator()
    threads = tf.train.start_queue_runners(sess=sess, coord=coord)
    for step in range(5):
        print(sess.run([target]))
    coord.request_stop()
    coord.join(threads, stop_grace_period_secs=10)
"""


def run_script(script: str, data_file: str) -> tuple[list[str], dict]:
    """Runs `script` in a fresh default graph; returns the lines it printed (one per step) and its names."""
    out = io.StringIO()
    names = {"__name__": "__main__"}
    with tf.Graph().as_default(), contextlib.redirect_stdout(out):
        exec(compile(script.replace("'1.txt'", repr(str(data_file))), "deeprec_script.py", "exec"), names)  # noqa: S102
    steps = [chunk for chunk in out.getvalue().split("[array(") if chunk.strip()]
    return steps, names


def unstaged(script: str) -> str:
    """The same script without a stage at all: the values every staged run must print."""
    return (script.replace("staged = tf.staged([user, item])", "staged = [user, item]")
            .replace("hooks=[tf.make_prefetch_hook()]", "hooks=[]").replace(FLAG_LINE, ""))
