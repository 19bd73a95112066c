import os

# TensorFlow's C++ start-up chatter hides test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()


@pytest.fixture
def graph():
    """A fresh default tf.Graph for one test."""
    g = tf.Graph()
    with g.as_default():
        yield g

tf.get_logger().setLevel("ERROR")  # deprecation notices of the queue-based input pipelines
