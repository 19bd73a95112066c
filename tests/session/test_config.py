"""The stock ConfigProto fields reach TensorFlow through both sessions; the SmartStage flags do not."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage as ss
from smartstage.config.options import OPTIMIZER_NAME
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.session import Session
from tests.session.graphs import bounded, init_ops, small_model


def deeprec_config():
    config = ss.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    return config


def stock_config():
    return ss.enable_smart_stage(tf.compat.v1.ConfigProto())


def with_stock_fields(config):
    """Two CPU devices, no soft placement, two inter-op pools (0: the step, 1: the prefetch runs)."""
    config.device_count["CPU"] = 2
    config.allow_soft_placement = False
    config.inter_op_parallelism_threads = 2
    del config.session_inter_op_thread_pool[:]
    config.session_inter_op_thread_pool.add(num_threads=0)
    config.session_inter_op_thread_pool.add(num_threads=1)
    return config


def build():
    """The small model with a stage that runs on pool 1, and an op pinned to the second CPU device."""
    model = small_model(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=1)
    with tf.device("/cpu:1"):
        on_cpu1 = tf.identity(model.loss * 2.0, name="on_cpu1")
    return model, on_cpu1


@pytest.mark.parametrize("make_config", [deeprec_config, stock_config], ids=["ss.ConfigProto", "stock"])
def test_plain_session_passes_the_stock_fields(make_config):
    graph = tf.Graph()
    with graph.as_default():
        model, on_cpu1 = build()
    with Session(graph=graph, config=with_stock_fields(make_config())) as sess:
        assert sess.smart_stage.changed
        assert isinstance(sess._config, config_pb2.ConfigProto)  # noqa: SLF001
        assert [e.name for e in sess._config.graph_options.rewrite_options.custom_optimizers] == []  # noqa: SLF001
        assert sum(d.device_type == "CPU" for d in sess.list_devices()) == 2
        sess.run(init_ops(graph))
        doubled, loss, _ = sess.run([on_cpu1, model.loss, model.train_op], options=bounded())
        assert doubled == pytest.approx(2 * loss)
        # The stage folds into its dataset (no thread of ours); both pools reach TensorFlow all the same.
        assert sess.prefetch_threads is None and len(sess._config.session_inter_op_thread_pool) == 2  # noqa: SLF001


@pytest.mark.parametrize("make_config", [deeprec_config, stock_config], ids=["ss.ConfigProto", "stock"])
def test_monitored_session_passes_the_stock_fields(make_config):
    with tf.Graph().as_default():
        model, on_cpu1 = build()
        with MonitoredTrainingSession(config=with_stock_fields(make_config()),
                                      hooks=[ss.make_prefetch_hook()]) as sess:
            doubled, loss, _ = sess.run([on_cpu1, model.loss, model.train_op])
            assert doubled == pytest.approx(2 * loss)
            raw = sess._tf_sess()  # noqa: SLF001
            assert len(raw._config.session_inter_op_thread_pool) == 2  # noqa: SLF001
            assert all(e.name != OPTIMIZER_NAME for e in raw._config.graph_options.rewrite_options.custom_optimizers)  # noqa: SLF001


def test_without_the_device_count_the_pinned_op_fails():
    """The control case: the op on /cpu:1 needs device_count to reach TensorFlow."""
    graph = tf.Graph()
    with graph.as_default():
        model, on_cpu1 = build()
    config = with_stock_fields(deeprec_config())
    del config.device_count["CPU"]
    with Session(graph=graph, config=config) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="cpu:1|CPU:1"):
            sess.run(init_ops(graph))
            sess.run(on_cpu1, options=bounded())


def test_the_monitored_session_keeps_the_stock_signature():
    import inspect

    stock = inspect.signature(tf.compat.v1.train.MonitoredTrainingSession).parameters
    ours = inspect.signature(ss.MonitoredTrainingSession).parameters
    assert list(ours)[: len(stock)] == list(stock)
    assert all(ours[name].default == stock[name].default for name in stock)
    assert ours["targets"].kind is inspect.Parameter.KEYWORD_ONLY
