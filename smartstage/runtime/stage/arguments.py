"""Checks of staged()'s arguments at the boundary: a project error naming the argument and what it takes.

    before:  ss.staged(x, feed_dict={"p": 1})   # AttributeError: 'str' object has no attribute 'dtype'
    after:   ConfigError: staged(): feed_dict key 'p' is a str; key feed_dict by placeholder tensors ...

staged() builds ops in the graph its features belong to; these checks run before any op is built, so a
refused call leaves the graph as it was.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from smartstage.errors import ConfigError

# TensorFlow's rule for a name scope (tensorflow/python/framework/ops.py, _VALID_SCOPE_NAME_REGEX).
_VALID_SCOPE = re.compile(r"^[A-Za-z0-9_.\\/>-]*$")
_VALID_START = re.compile(r"^[A-Za-z0-9.]")


def check_staged_arguments(features: Any, feed_dict: Any, name: Any) -> None:
    """ConfigError naming the first bad argument of staged(features, feed_dict=..., name=...).

        before:  staged(x, name="bad name!")    # ValueError from TensorFlow's name scope
        after:   ConfigError: staged(): name='bad name!' is not a valid name scope; ...
    """
    _check_name(name)
    _check_feed_dict(feed_dict)
    _check_not_in_loop(features)


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
