"""DeepRec's `tf` API on stock TensorFlow: a DeepRec training script runs with its import changed.

    import tensorflow as tf                    # DeepRec (TensorFlow 1 with SmartStage)
    from smartstage.compat import tf           # stock TensorFlow 2.21 with smartstage

`tf` is tf.compat.v1 with DeepRec's additions taken from smartstage:

    tf.staged, tf.make_prefetch_hook                     smartstage.staged, smartstage.make_prefetch_hook
    tf.ConfigProto                                       smartstage.ConfigProto (has do_smart_stage)
    tf.SmartStageOptions                                 smartstage.config.deeprec_smart_stage_options (auto-stage)
    tf.Session                                           smartstage.Session
    tf.train.MonitoredTrainingSession                    smartstage.MonitoredTrainingSession
    tf.train.mark_target_node                            smartstage.mark_target_node

DeepRec scripts are TensorFlow 1 programs, so importing this module turns eager execution off.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

import tensorflow as _tf

from smartstage.config.deeprec import ConfigProto, deeprec_smart_stage_options
from smartstage.runtime import make_prefetch_hook, mark_target_node, staged
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.session import Session


class _Namespace(types.ModuleType):
    """A module that answers with its own names first and falls back to a TensorFlow module."""

    def __init__(self, name: str, base: types.ModuleType, own: Mapping[str, Any]):
        super().__init__(name, base.__doc__)
        self.__dict__.update(own)
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._base)) | set(self.__dict__))


train = _Namespace(__name__ + ".tf.train", _tf.compat.v1.train, {
    "MonitoredTrainingSession": MonitoredTrainingSession,
    "mark_target_node": mark_target_node,
})

tf = _Namespace(__name__ + ".tf", _tf.compat.v1, {
    "staged": staged,
    "make_prefetch_hook": make_prefetch_hook,
    "ConfigProto": ConfigProto,
    "SmartStageOptions": deeprec_smart_stage_options,
    "Session": Session,
    "train": train,
})

_tf.compat.v1.disable_eager_execution()

__all__ = ["tf"]
