"""Every stock API that takes a session config, taking the DeepRec-style one and applying SmartStage.

    from smartstage.compat import tf
    config = tf.ConfigProto()                                    # or a stock ConfigProto + ss.enable_smart_stage
    config.graph_options.optimizer_options.do_smart_stage = True
    creator = tf.train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=ckpt, config=config)
    with tf.train.MonitoredSession(session_creator=creator, hooks=[tf.make_prefetch_hook()]) as sess:
        sess.run(auc_op)                                         # the graph rewritten, fetches mapped

Stock TensorFlow hands the config to a stock Session, which rejects the DeepRec-style message
(`TypeError: Argument config must be a tf.ConfigProto`) and ignores the SmartStage flags of a stock
one. Here each API reads the flags (options_from_config), rewrites the live graph before its first
step (smartstage.session.prepare_graph, once per graph: a graph an earlier session rewrote stays
rewritten) and gives TensorFlow the stock config with a prefetch pool (session_config):

    ChiefSessionCreator, WorkerSessionCreator    rewrite in create_session()
    MonitoredSession, SingularMonitoredSession   rewrite before the hooks' begin(); the prefetch hook is
                                                 required for a graph with stages; fetches mapped
    Supervisor                                   rewrite in prepare_or_wait_for_session / managed_session
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable

import tensorflow as _tf

from smartstage.config.options import options_from_config
from smartstage.session.monitored import SmartMonitoredSession, smart_hooks
from smartstage.session.session import prepare_graph, session_config

from .deeprec_only import refuse_config_features

_train = _tf.compat.v1.train


class ChiefSessionCreator(_train.ChiefSessionCreator):
    """tf.compat.v1.train.ChiefSessionCreator taking an ss.ConfigProto or a stock one with the SmartStage flags.

        before:  ChiefSessionCreator(config=deeprec_config).create_session()   # TypeError in the stock Session
        after:   the default graph rewritten when the flags are on, then the stock session created
    """

    def __init__(self, scaffold=None, master="", config=None, checkpoint_dir=None,
                 checkpoint_filename_with_path=None):
        self.smart_stage_config = config
        refuse_config_features(config)
        super().__init__(scaffold=scaffold, master=master, config=session_config(config, master),
                         checkpoint_dir=checkpoint_dir, checkpoint_filename_with_path=checkpoint_filename_with_path)

    def create_session(self):
        prepare_graph(_tf.compat.v1.get_default_graph(), options_from_config(self.smart_stage_config))
        return super().create_session()


class WorkerSessionCreator(_train.WorkerSessionCreator):
    """tf.compat.v1.train.WorkerSessionCreator taking an ss.ConfigProto or a stock one with the SmartStage flags.

        before:  WorkerSessionCreator(master=target, config=deeprec_config)   # TypeError in the stock Session
        after:   each worker rewrites its own default graph, then waits for the chief as before
    """

    def __init__(self, scaffold=None, master="", config=None, max_wait_secs=30 * 60):
        self.smart_stage_config = config
        refuse_config_features(config)
        super().__init__(scaffold=scaffold, master=master, config=session_config(config, master),
                         max_wait_secs=max_wait_secs)

    def create_session(self):
        prepare_graph(_tf.compat.v1.get_default_graph(), options_from_config(self.smart_stage_config))
        return super().create_session()


def _creator_config(session_creator) -> Any:
    """The SmartStage config of a session creator; a stock creator's own config is made stock in place."""
    if session_creator is None:
        return None
    if hasattr(session_creator, "smart_stage_config"):
        return session_creator.smart_stage_config
    config = getattr(session_creator, "_config", None)  # a creator built from tensorflow directly
    if config is not None:
        # Its stock Session would reject an ss.ConfigProto, and Grappler logs an error for the unknown
        # SmartStage entry of a stock one; the flags are applied here instead.
        session_creator._config = session_config(config, getattr(session_creator, "_master", ""))  # noqa: SLF001
    return config


def MonitoredSession(session_creator=None, hooks=None, stop_grace_period_secs=120,  # noqa: N802
                     *, targets: Iterable[Any] | None = None) -> SmartMonitoredSession:
    """tf.compat.v1.train.MonitoredSession with the config of its session creator applied.

        before:  MonitoredSession(session_creator=ChiefSessionCreator(config=deeprec_config), hooks=hooks)
        after:   the same call; the default graph is rewritten when the flags are on, fetches are mapped

    A creator from this module, or a stock one whose config carries the flags. The prefetch hook is
    required for a graph with stages, as in MonitoredTrainingSession.
    """
    config = _creator_config(session_creator)
    if session_creator is None:
        session_creator = ChiefSessionCreator()
    options = options_from_config(config)
    record, mapper, hooks, _ = smart_hooks(_tf.compat.v1.get_default_graph(), options, hooks, (), True, targets)
    session = _train.MonitoredSession(session_creator=session_creator, hooks=hooks,
                                      stop_grace_period_secs=stop_grace_period_secs)
    return SmartMonitoredSession(session, mapper, record)


def SingularMonitoredSession(hooks=None, scaffold=None, master="", config=None, checkpoint_dir=None,  # noqa: N802
                             stop_grace_period_secs=120, checkpoint_filename_with_path=None,
                             *, targets: Iterable[Any] | None = None) -> SmartMonitoredSession:
    """tf.compat.v1.train.SingularMonitoredSession taking an ss.ConfigProto or a stock one with the flags.

        before:  SingularMonitoredSession(config=deeprec_config, hooks=hooks)   # TypeError in the stock Session
        after:   the default graph rewritten when the flags are on; raw_session() is the stock one
    """
    refuse_config_features(config)
    options = options_from_config(config)
    record, mapper, hooks, _ = smart_hooks(_tf.compat.v1.get_default_graph(), options, hooks, (), True, targets)
    session = _train.SingularMonitoredSession(
        hooks=hooks, scaffold=scaffold, master=master, config=session_config(config, master),
        checkpoint_dir=checkpoint_dir, stop_grace_period_secs=stop_grace_period_secs,
        checkpoint_filename_with_path=checkpoint_filename_with_path)
    return SmartMonitoredSession(session, mapper, record)


class Supervisor(_train.Supervisor):
    """tf.compat.v1.train.Supervisor whose sessions take an ss.ConfigProto or a stock one with the flags.

        before:  sv.managed_session(config=deeprec_config)     # TypeError in the stock Session
        after:   the supervisor's graph rewritten when the flags are on (a finalized graph too)

    The Supervisor has no hooks: start the prefetch threads yourself,
    `smartstage.start_prefetch_threads(sess, coord=sv.coord)`; sv.stop() then stops them.
    """

    def prepare_or_wait_for_session(self, master="", config=None, wait_for_checkpoint=False,
                                    max_wait_secs=7200, start_standard_services=True):
        refuse_config_features(config)
        prepare_graph(self._graph, options_from_config(config))  # noqa: SLF001  (the Supervisor's own graph)
        return super().prepare_or_wait_for_session(
            master=master, config=session_config(config, master), wait_for_checkpoint=wait_for_checkpoint,
            max_wait_secs=max_wait_secs, start_standard_services=start_standard_services)


def checked_config(session_api: Callable[..., Any]) -> Callable[..., Any]:
    """`session_api` refusing, before it builds anything, a config whose DeepRec-only fields change the training.

        before:  MonitoredTrainingSession(config=config_with_micro_batch_num_2)   # half-size batches, silently
        after:   checked_config(MonitoredTrainingSession)(config=...)            # DeepRecFeatureError: --micro_batch 0
    """
    signature = inspect.signature(session_api)

    @functools.wraps(session_api)
    def call(*args: Any, **kwargs: Any) -> Any:
        refuse_config_features(signature.bind_partial(*args, **kwargs).arguments.get("config"))
        return session_api(*args, **kwargs)

    return call
