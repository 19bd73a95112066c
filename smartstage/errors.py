"""SmartStage's own exception types.

Every error names what is wrong (a node, a field, a file, a stage) and what to do about it.
Catch `SmartStageError` to catch them all.
"""

from __future__ import annotations


class SmartStageError(Exception):
    """Base class of every error SmartStage raises on purpose."""


class GraphError(SmartStageError):
    """The input graph is malformed: a duplicate or missing node, a cycle, an unreadable file."""


class NoStageError(SmartStageError):
    """The graph has no stage boundary to expand."""


class ConfigError(SmartStageError, ValueError):
    """A flag, option or argument has a wrong name, type or value."""


class DeepRecFeatureError(ConfigError):
    """A DeepRec-only feature that stock TensorFlow cannot run: the message names the script flag that turns it off."""


class PassError(SmartStageError):
    """A pass failed, or the graph it produced failed verification.

    `pass_name` is the failing pass, `passes_before` the ones that ran before it.
    """

    def __init__(self, message: str, pass_name: str = "", passes_before: tuple[str, ...] = ()):
        super().__init__(message)
        self.pass_name = pass_name
        self.passes_before = tuple(passes_before)


class VerificationError(SmartStageError):
    """A rewritten graph breaks an invariant (acyclic, inputs resolve, boundary dtypes match)."""


class StageRuntimeError(SmartStageError):
    """The staging runtime was used wrongly: no prefetch threads started, a missing thread pool, ..."""


class InputTaskError(StageRuntimeError):
    """An input task died, is unreachable, or did not answer in time (runtime/lanes/remote.py); the message
    names it. `task` is the task's device name, `cause` the TensorFlow error that showed it."""

    def __init__(self, message: str, task: str, cause: BaseException | None = None):
        super().__init__(message)
        self.task = task
        self.cause = cause


class TargetError(SmartStageError, ValueError):
    """A target, fetch or feed names a node that does not exist or that sits on the prefetch side."""


class EagerModeError(SmartStageError, RuntimeError):
    """A tf.compat.v1 graph API was called while TensorFlow 2 executes eagerly (its default).

    The message names the entry point and what to call instead: the TF2 entry point, or
    `tf.compat.v1.disable_eager_execution()` (or `with tf.Graph().as_default():`) for a v1 graph.
    """


class SplitError(SmartStageError, ValueError):
    """A TF2 training step or Keras model cannot be split as given (smartstage.tf2): nothing to move, an element
    spec that does not fit the step, a step that reads Python state, a model that is not functional, ...
    The message names the cause and the fix; nothing was changed (the user's step, model and dataset are as given)."""


class NothingToMoveError(SplitError):
    """Nothing of a TF2 step or Keras model is worth moving to the dataset (smartstage.passes.cut_cost).

    `split()` raises it (an extra map would only cost); `ss.tf2.fit` catches it and trains with the model's own
    `model.fit`, saying why in the log and in `history.smartstage`. `reason` is that why, without the advice."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class StateChangedError(SmartStageError, RuntimeError):
    """The state check (`check_state=True`, or SMARTSTAGE_CHECK_STATE=1) found that deciding a split (analysis,
    tracing, the timed trial, verify) changed the user's state: a variable, a seed or generator, or the next
    iteration of the user's dataset. The message lists what changed. Deciding must change nothing, so this is a
    SmartStage bug; `measure=False` skips the trial meanwhile."""
