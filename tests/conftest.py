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


def pytest_collection_modifyitems(config, items):
    """Modules with a test marked slow come first, each module's order kept: the suite runs on several
    pytest-xdist workers, each taking whole modules in collection order, and the longest modules would
    otherwise start last and run alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
