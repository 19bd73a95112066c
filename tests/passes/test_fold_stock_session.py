"""optimize()'s MetaGraphDef of a folded stage trains on stock TensorFlow: another process that never imports
smartstage, a stock MonitoredTrainingSession with no hook, the same losses as the unoptimized graph."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.bounds import JOB_HANG_SECONDS
from tests.passes.test_fold_dataset import BATCH, ROWS, lookup_graph, optimized, run_flag_off

STOCK_TRAINING = """
import json, sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
tf.compat.v1.train.import_meta_graph(sys.argv[1])
graph = tf.compat.v1.get_default_graph()
loss, train = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
losses = []
with tf.compat.v1.train.MonitoredTrainingSession() as sess:   # stock: no hook, the default Scaffold
    while not sess.should_stop():
        losses.append(float(sess.run([loss, train])[0]))
assert not [m for m in sys.modules if m.split(".")[0] == "smartstage"], "smartstage was imported"
print(json.dumps(losses))
"""


@pytest.mark.parametrize("form", ["initializable", "one_shot", "reinitializable"])
def test_the_optimized_graph_trains_in_a_stock_monitored_training_session(form, tmp_path):
    meta = lookup_graph(form, capacity=4, num_threads=2)
    path = tmp_path / "optimized.meta"
    path.write_bytes(optimized(meta).meta_graph_def.SerializeToString())
    done = subprocess.run([sys.executable, "-c", STOCK_TRAINING, str(path)], capture_output=True, text=True,
                          timeout=JOB_HANG_SECONDS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [float(v) for v in run_flag_off(meta, ROWS // BATCH)]
    assert losses == expected  # every batch once, in order, the same values
