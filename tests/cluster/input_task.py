"""One input task of the loopback test cluster, in its own process; it exits by itself.

    python -m tests.cluster.input_task <job> <index> <cluster json> <lifetime seconds>

It needs TensorFlow only: the trainer's session runs the ops placed on it over gRPC.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def main(argv: list[str]) -> None:
    job, index, cluster_json, lifetime = argv[1], int(argv[2]), argv[3], float(argv[4])
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(cluster_json)), job_name=job, task_index=index)
    print(json.dumps({"job": job, "task": index, "target": server.target}), flush=True)
    time.sleep(lifetime)  # the server lives as long as the process; no join(): it never returns


if __name__ == "__main__":
    main(sys.argv)
