"""staged()'s arguments are checked at the boundary: a ConfigError naming the argument and what it takes."""

from __future__ import annotations

import pytest
import tensorflow as tf

import smartstage as ss


def _features():
    return tf.constant([1.0, 2.0], name="features")


@pytest.mark.parametrize("feed_dict, match", [
    ({"p": 1}, r"feed_dict key 'p' is a str.*placeholder tensors"),
    ([1, 2], r"feed_dict is a list.*dict"),
])
def test_a_bad_feed_dict_is_refused(feed_dict, match):
    with tf.Graph().as_default() as graph:
        with pytest.raises(ss.ConfigError, match=match):
            ss.staged(_features(), feed_dict=feed_dict)
        assert not [op for op in graph.get_operations() if op.name.startswith("stage")]  # nothing was built


@pytest.mark.parametrize("name", ["bad name!", "", 7, "-x"])
def test_a_bad_name_is_refused(name):
    with tf.Graph().as_default():
        with pytest.raises(ss.ConfigError, match=r"staged\(\): name=.*valid name scope"):
            ss.staged(_features(), name=name)


def test_a_good_name_names_the_stage():
    with tf.Graph().as_default():
        taken = ss.staged(_features(), name="input/stage_1")
    assert taken.op.name == "input/stage_1/take"


def test_staged_inside_a_while_loop_is_refused():
    with tf.Graph().as_default():
        def body(i):
            ss.staged(tf.cast(i, tf.float32))
            return i + 1

        with pytest.raises(ss.ConfigError, match=r"staged\(\): called inside a tf.while_loop.*outside the loop"):
            tf.while_loop(lambda i: i < 3, body, [tf.constant(0)])


def test_staged_inside_a_v1_cond_is_refused():
    with tf.Graph().as_default():
        x = _features()
        with pytest.raises(ss.ConfigError, match=r"staged\(\): called inside"):
            tf.compat.v1.cond(tf.constant(True), lambda: ss.staged(x), lambda: x)
