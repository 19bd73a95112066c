"""The guard of the v1 graph entry points in TensorFlow 2's default (eager) mode.

    before:  ss.staged(x)     # AttributeError: Tensor.graph is undefined when eager execution is enabled
    after:   EagerModeError: staged(): called in eager mode (TensorFlow 2's default) ...; for a TF2 step use
             smartstage.tf2 ...; for a v1 graph call tf.compat.v1.disable_eager_execution() at program start ...

Every public entry point that builds into, or runs, a tf.compat.v1 graph calls `require_graph_mode` first;
load_graph (optimize(), explain, graph_diff, verify_rewrite) calls `reject_eager_input` on what it is given. Inside
`with tf.Graph().as_default():` TensorFlow does not execute eagerly, so a v1 graph built there passes.
TensorFlow is imported when a guard runs, not with this module.
"""

from __future__ import annotations

from typing import Any

from smartstage.errors import EagerModeError

# The TF2 entry points, named in every message of this module (smartstage/tf2/).
TF2_STEP_ENTRY = "smartstage.tf2.split(step, dataset)"
TF2_KERAS_ENTRY = "smartstage.tf2.fit(model, dataset)"
SESSION_HOOK = ("is a SessionRunHook of a tf.compat.v1 MonitoredTrainingSession, which runs a graph (run that "
                "session inside `with graph.as_default():`)")
V1_GRAPH_FIX = ("call tf.compat.v1.disable_eager_execution() at program start (or build the graph inside "
                "`with tf.Graph().as_default():`)")


def _eager_tensors(values: Any) -> list[Any]:
    import tensorflow as tf

    try:
        leaves = tf.nest.flatten(values, expand_composites=True) if values is not None else []
    except (TypeError, ValueError):  # the entry point's own checks name a malformed argument
        return []
    return [leaf for leaf in leaves if type(leaf).__name__ == "EagerTensor"]


def require_graph_mode(entry_point: str, values: Any = None, *, what: str = "builds a tf.compat.v1 graph") -> None:
    """EagerModeError when `entry_point` runs eagerly or `values` hold eager tensors; else nothing.

        require_graph_mode("staged()", features)   # eager: EagerModeError naming the TF2 entry point and the fix
        with tf.Graph().as_default(): require_graph_mode("staged()", features)   # a v1 graph: passes
    """
    import tensorflow as tf

    eager_values = _eager_tensors(values)
    if not tf.executing_eagerly() and not eager_values:
        return
    where = ("was called in eager mode (TensorFlow 2's default)" if tf.executing_eagerly()
             else "was given an eager tensor (a value computed in eager mode, not a graph tensor)")
    raise EagerModeError(
        f"{entry_point}: {where}, but it {what}; for a tf.data + tf.function training step use "
        f"{TF2_STEP_ENTRY} (Keras model.fit: {TF2_KERAS_ENTRY}), or for a v1 graph {V1_GRAPH_FIX}"
    )


def eager_input_kind(value: Any) -> str | None:
    """What TF2 object `value` is, when it is one that holds no graph to load; else None.

        eager_input_kind(tf.function(f))   # before: optimize() says "cannot optimize a Function"
        eager_input_kind(graph_def)        # after:  "a tf.function", and None for a GraphDef
    """
    kinds = [(cls.__name__, kind) for cls in type(value).__mro__ for name, kind in _KINDS if cls.__name__ == name]
    if not kinds:
        return None
    return kinds[0][1]


_KINDS = (
    ("EagerTensor", "an eager tensor (a value, not a graph)"),
    ("Function", "a tf.function (a TF2 step: trace it for a graph)"),
    ("PolymorphicFunction", "a tf.function (a TF2 step: trace it for a graph)"),
    ("ConcreteFunction", "a ConcreteFunction (a traced TF2 step)"),
    ("DatasetV2", "a tf.data.Dataset"),
    ("Model", "a Keras model"),
    ("Layer", "a Keras layer"),
    ("Module", "a tf.Module"),
)


def reject_eager_input(value: Any) -> None:
    """EagerModeError when `value`, given where a graph is read, is a TF2 object (a tf.function, a Keras model).

        reject_eager_input(step)        # a tf.function: EagerModeError naming the TF2 entry point
        reject_eager_input(graph_def)   # passes
    """
    kind = eager_input_kind(value)
    if kind is None:
        return
    raise EagerModeError(
        f"cannot read a graph from {kind}; to split a TF2 training step call "
        f"{TF2_STEP_ENTRY} (Keras model.fit: {TF2_KERAS_ENTRY}), or to inspect one step's graph offline pass "
        "step.get_concrete_function(*input_specs).graph"
    )
