"""Checks of staged()'s arguments at the boundary: a project error naming the argument and what it takes.

    before:  ss.staged(x, feed_dict={"p": 1})   # AttributeError: 'str' object has no attribute 'dtype'
    after:   ConfigError: staged(): feed_dict key 'p' is a str; key feed_dict by placeholder tensors ...

staged() builds ops in the graph its features belong to; these checks run before any op is built, so a
refused call leaves the graph as it was.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import tensorflow as tf

from smartstage.errors import ConfigError
from smartstage.graph.eager import require_graph_mode
from smartstage.runtime.stage.settings import AUTOTUNE

# TensorFlow's rule for a name scope (tensorflow/python/framework/ops.py, _VALID_SCOPE_NAME_REGEX).
_VALID_SCOPE = re.compile(r"^[A-Za-z0-9_.\\/>-]*$")
_VALID_START = re.compile(r"^[A-Za-z0-9.]")


def check_staged_arguments(features: Any, feed_dict: Any, name: Any) -> None:
    """ConfigError naming the first bad argument of staged(features, feed_dict=..., name=...).

        before:  staged(x, name="bad name!")    # ValueError from TensorFlow's name scope
        after:   ConfigError: staged(): name='bad name!' is not a valid name scope; ...
    """
    require_graph_mode("staged()", features)
    _check_name(name)
    _check_feed_dict(feed_dict)
    _check_not_in_loop(features)


def check_setting_arguments(capacity, num_threads, num_clients, timeout_millis, use_pool, pool_id, stream_id,
                            max_buffered_bytes) -> None:
    """ConfigError naming the first of staged()'s numeric settings that is neither valid nor AUTOTUNE.

        before:  staged(x, capacity=0)
        after:   ConfigError: staged(): capacity=0; pass an integer >= 1 or smartstage.AUTOTUNE
    """
    for label, value in (("capacity", capacity), ("num_threads", num_threads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (value < 1 and value != AUTOTUNE):
            raise ConfigError(f"staged(): {label}={value!r}; pass an integer >= 1 or smartstage.AUTOTUNE")
    if not isinstance(use_pool, (bool, np.bool_)) and use_pool != AUTOTUNE:
        raise ConfigError(f"staged(): use_stage_subgraph_thread_pool={use_pool!r}; pass True, False or "
                          "smartstage.AUTOTUNE")
    for label, value, least in (
        ("max_buffered_bytes", 1 if max_buffered_bytes is None else max_buffered_bytes, 1),
        ("num_clients", num_clients, 1),
        ("timeout_millis", timeout_millis, 1),
        ("stage_subgraph_thread_pool_id", 0 if pool_id == AUTOTUNE else pool_id, 0),
        ("stage_subgraph_stream_id", stream_id, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ConfigError(f"staged(): {label}={value!r}; pass an integer >= {least}")


def _check_name(name: Any) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not name.strip("/") or not _VALID_START.match(name) \
            or not _VALID_SCOPE.match(name):
        raise ConfigError(
            f"staged(): name={name!r} is not a valid name scope; pass None (the default, 'stage') or a string of "
            "letters, digits and '_', '.', '-', '/' that starts with a letter, a digit or '.'"
        )


def _check_feed_dict(feed_dict: Any) -> None:
    if feed_dict is None:
        return
    if not isinstance(feed_dict, dict):
        raise ConfigError(
            f"staged(): feed_dict is a {type(feed_dict).__name__}; pass a dict {{placeholder tensor: value}} "
            "(or None)"
        )
    for key in feed_dict:
        if not isinstance(key, (tf.Tensor, tf.SparseTensor)):
            raise ConfigError(
                f"staged(): feed_dict key {key!r} is a {type(key).__name__}; key feed_dict by the prefetch-side "
                "placeholder tensors themselves (tf.compat.v1.placeholder(...)), not by names"
            )


def _check_not_in_loop(features: Any) -> None:
    graphs = [t.graph for t in tf.nest.flatten(features, expand_composites=True) if hasattr(t, "graph")]
    for graph in graphs + [tf.compat.v1.get_default_graph()]:
        in_function = getattr(graph, "building_function", False)
        if in_function or graph._get_control_flow_context() is not None:  # noqa: SLF001
            where = type(graph).__name__ if in_function else "a tf.compat.v1 control-flow context"
            raise ConfigError(
                f"staged(): called inside a tf.while_loop, tf.cond or tf.function body ({where}); a stage is "
                "filled once per batch by prefetch threads running the outer graph, so call staged() on the "
                "input features outside the loop and use its result inside"
            )
