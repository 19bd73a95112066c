"""The example builders in both of TensorFlow's modes: a v1 graph of their own when TF2 executes eagerly.

    before:  build_dlrm(path)   # eager (TF2's default): TypeError: OwnedIterator.get_next() got ... 'name'
    after:   build_dlrm(path)   # eager: built into a new tf.Graph (model.graph); graph mode: the default graph

The builders write tf.compat.v1 graphs (iterators, queues, variables, a train op); run them with
`run_steps(model.graph, ...)` or a `tf.compat.v1.Session(graph=model.graph)` in either mode.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import tensorflow as tf

Built = TypeVar("Built")


def builds_a_v1_graph(build: Callable[..., Built]) -> Callable[..., Built]:
    """`build` unchanged in graph mode; in eager mode, run inside `with tf.Graph().as_default():`.

        @builds_a_v1_graph
        def build_demo(path, stage_fn=no_stage): ...   # eager: ModelGraph(graph=<its own tf.Graph>, ...)
    """
    @functools.wraps(build)
    def in_a_graph(*args, **kwargs) -> Built:
        if not tf.executing_eagerly():
            return build(*args, **kwargs)
        with tf.Graph().as_default():
            return build(*args, **kwargs)

    return in_a_graph


def require_a_graph(graph: tf.Graph | None, function: str) -> tf.Graph:
    """`graph`, or the default graph in graph mode; in eager mode a missing graph is a ValueError.

        export_graph_def()             # eager: ValueError: pass the model's graph (model.graph) ...
        export_graph_def(model.graph)  # either mode: that graph
    """
    if graph is not None:
        return graph
    if tf.executing_eagerly():
        raise ValueError(
            f"{function}: in eager mode (TensorFlow 2's default) there is no default graph holding the model; "
            f"pass the model's graph ({function.rstrip('()')}(model.graph)), or call "
            "tf.compat.v1.disable_eager_execution() at program start"
        )
    return tf.compat.v1.get_default_graph()
