"""DeepRec's `tf` on stock TensorFlow 2.21: a DeepRec model-zoo training script runs with its import changed.

    import tensorflow as tf                    # DeepRec (TensorFlow 1 with SmartStage)
    from smartstage.compat import tf           # stock TensorFlow 2.21 with smartstage

`tf` is tf.compat.v1 with DeepRec's names taken from smartstage (docs/porting-deeprec.md has the list):

    tf.staged, tf.make_prefetch_hook, tf.train.mark_target_node     smartstage's runtime
    tf.ConfigProto                       smartstage.ConfigProto: DeepRec's optimizer options (do_smart_stage, ...)
    tf.SmartStageOptions                 auto-stage options (DeepRec's message)
    tf.Session, tf.train.MonitoredTrainingSession, MonitoredSession, SingularMonitoredSession,
    ChiefSessionCreator, WorkerSessionCreator, Supervisor
                                         take either config spelling and apply SmartStage (compat.sessions)
    tf.layers, tf.keras                  TensorFlow 2.21's legacy Keras (tf-keras), whatever was imported first
    DeepRec-only features                one DeepRecFeatureError naming the script flag that turns them off
                                         (compat.deeprec_only)
    DeepRec-only keywords of stock APIs  accepted where the stock call computes the same (do_fusion on the
                                         feature columns, linear_model, input_layer), else DeepRecFeatureError
                                         naming the script flag (compat.keywords); tf.distribute.Server refuses
                                         DeepRec's protocols

DeepRec scripts are TensorFlow 1 programs, so importing this module turns eager execution off.
"""

from __future__ import annotations

import tensorflow as _tf

from smartstage.config.deeprec import ConfigProto, deeprec_smart_stage_options
from smartstage.runtime import mark_target_node, staged
from smartstage.session.monitored import MonitoredTrainingSession
from smartstage.session.prefetch_hook import make_prefetch_hook
from smartstage.session.session import Session

from . import imports, sessions
from .deeprec_only import UNSUPPORTED, DeepRecFeatureError, EmbeddingVariableOption, raiser, variable_scope
from .keywords import FEATURE_COLUMN_APIS, Server, with_deeprec_keywords
from .keras import legacy_keras_v1, legacy_layers
from .namespace import Namespace


def _unsupported(prefix: str) -> dict:
    return {key[len(prefix):]: raiser(entry) for key, entry in UNSUPPORTED.items()
            if key.startswith(prefix) and "." not in key[len(prefix):]}


class _NoEstimator(Namespace):
    """`tf.estimator`: not part of TensorFlow 2.21; every name raises DeepRecFeatureError saying so."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise DeepRecFeatureError(
            f"tf.estimator.{name}: TensorFlow 2.21 has no Estimator (removed in 2.16; tensorflow-estimator 2.15, "
            "its last release, does not load on 2.21): train with tf.train.MonitoredTrainingSession, whose "
            "config= takes the DeepRec-style ConfigProto")


train = Namespace(__name__ + ".tf.train", _tf.compat.v1.train, {
    "MonitoredTrainingSession": with_deeprec_keywords(sessions.checked_config(MonitoredTrainingSession),
                                                      "tf.train.MonitoredTrainingSession"),
    "MonitoredSession": sessions.MonitoredSession,
    "SingularMonitoredSession": sessions.SingularMonitoredSession,
    "ChiefSessionCreator": sessions.ChiefSessionCreator,
    "WorkerSessionCreator": sessions.WorkerSessionCreator,
    "Supervisor": sessions.Supervisor,
    "mark_target_node": mark_target_node,
    "Server": Server,
    **_unsupported("train."),
})

distribute = Namespace(__name__ + ".tf.distribute", _tf.compat.v1.distribute, {"Server": Server})

feature_column = Namespace(__name__ + ".tf.feature_column", _tf.compat.v1.feature_column, {
    **FEATURE_COLUMN_APIS,
    **_unsupported("feature_column."),
})

config = Namespace(__name__ + ".tf.config", _tf.compat.v1.config, {
    "experimental": Namespace(__name__ + ".tf.config.experimental", _tf.compat.v1.config.experimental,
                              _unsupported("config.experimental.")),
})

tf = Namespace(__name__ + ".tf", _tf.compat.v1, {
    "staged": staged,
    "make_prefetch_hook": make_prefetch_hook,
    "ConfigProto": ConfigProto,
    "SmartStageOptions": deeprec_smart_stage_options,
    "Session": Session,
    "train": train,
    "feature_column": feature_column,
    "config": config,
    "distribute": distribute,
    "variable_scope": variable_scope,
    "EmbeddingVariableOption": EmbeddingVariableOption,
    "estimator": _NoEstimator(__name__ + ".tf.estimator", _tf.compat.v1, {}),
    **_unsupported(""),
}, lazy={"layers": legacy_layers, "keras": legacy_keras_v1})

imports.install()
_tf.compat.v1.disable_eager_execution()

__all__ = ["DeepRecFeatureError", "tf"]
