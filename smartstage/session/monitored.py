"""ss.MonitoredTrainingSession: the stock MonitoredTrainingSession with the graph optimized at creation.

    with ss.MonitoredTrainingSession(config=config, hooks=[ss.make_prefetch_hook()]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

Creating it (before any hook's begin() and any step) checks that a graph with stages has the
prefetch hook (DeepRec requires it; a missing one raises StageRuntimeError instead of a hang),
then rewrites the default graph when the config's flags are on (smartstage.session.session.prepare_graph),
then creates the stock session with the stock ConfigProto fields and a prefetch pool (session_config).
The returned SmartMonitoredSession maps fetches of moved tensors to the take outputs that carry
them; so do the user's hooks (each wrapped so its SessionRunArgs are mapped) and a run_step_fn's
runs. A last hook rewires ops that the hooks built in begin() (adopt_late_ops).
"""

from __future__ import annotations

from typing import Iterable

import tensorflow as tf
from tensorflow.python.training import monitored_session

from smartstage.config.options import SmartStageOptions, options_from_config
from smartstage.errors import StageRuntimeError
from smartstage.graph.eager import require_graph_mode
from smartstage.session.fetches import FetchMapper
from smartstage.session.record import LiveRewrite
from smartstage.session.live_rewrite import adopt_late_ops
from smartstage.session.prefetch_hook import FoldingPrefetchHook
from smartstage.runtime import PrefetchHook, stage_defs
from smartstage.session.session import prepare_graph, session_config

USE_DEFAULT = monitored_session.USE_DEFAULT


class _MappedHook(tf.compat.v1.train.SessionRunHook):
    """A user's hook whose SessionRunArgs fetches are mapped like the user's own fetches."""

    def __init__(self, hook: tf.compat.v1.train.SessionRunHook, mapper: FetchMapper):
        self.hook = hook
        self._mapper = mapper

    def begin(self):
        self.hook.begin()

    def after_create_session(self, session, coord):
        self.hook.after_create_session(session, coord)

    def before_run(self, run_context):
        args = self.hook.before_run(run_context)
        if args is None:
            return None
        fetches = self._mapper.map_fetches(args.fetches)
        self._mapper.check_feeds(args.feed_dict)
        if fetches is args.fetches:
            return args
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=args.feed_dict, options=args.options)

    def after_run(self, run_context, run_values):
        self.hook.after_run(run_context, run_values)

    def end(self, session):
        self.hook.end(session)

    def __repr__(self) -> str:
        return f"_MappedHook({self.hook!r})"


class _AdoptLateOpsHook(tf.compat.v1.train.SessionRunHook):
    """Runs last among the hooks' begin(): ops the hooks built read the new takes (adopt_late_ops)."""

    def __init__(self, graph: tf.Graph, record: LiveRewrite):
        self._graph, self._record = graph, record

    def begin(self):
        adopt_late_ops(self._graph, self._record)


def _prefetch_hooks(hooks: Iterable) -> list[PrefetchHook]:
    return [h for h in hooks if isinstance(h, PrefetchHook)]


def require_prefetch_hook(graph: tf.Graph, hooks: Iterable) -> None:
    """StageRuntimeError when `graph` has stages and none of `hooks` runs their prefetch threads."""
    stages = [d.name for d in stage_defs(graph)]
    if stages and not _prefetch_hooks(hooks):
        raise StageRuntimeError(
            f"the graph has stage(s) {stages}, but the MonitoredTrainingSession has no prefetch hook, so its "
            "first step would wait for a batch that nobody prefetches. Pass "
            "hooks=[smartstage.make_prefetch_hook()] (DeepRec: tf.make_prefetch_hook()); a non-chief worker "
            "needs it in hooks, not in chief_only_hooks"
        )


class _MappedStepContext:
    """The StepContext a run_step_fn step_fn sees, with its runs mapped."""

    def __init__(self, context, mapper: FetchMapper):
        self._context, self._mapper = context, mapper

    @property
    def session(self):
        return _MappedRawSession(self._context.session, self._mapper)

    def run_with_hooks(self, fetches, feed_dict=None, **kwargs):
        self._mapper.check_feeds(feed_dict)
        return self._context.run_with_hooks(self._mapper.map_fetches(fetches), feed_dict=feed_dict, **kwargs)

    def request_stop(self):
        return self._context.request_stop()


class _MappedRawSession:
    def __init__(self, session, mapper: FetchMapper):
        self._session, self._mapper = session, mapper

    def run(self, fetches, feed_dict=None, **kwargs):
        self._mapper.check_feeds(feed_dict)
        return self._session.run(self._mapper.map_fetches(fetches), feed_dict=feed_dict, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


class SmartMonitoredSession:
    """The session ss.MonitoredTrainingSession returns: a stock MonitoredSession whose runs are mapped.

    Everything else (should_stop, close, the context manager, graph, ...) is the stock session's.
    """

    def __init__(self, session, mapper: FetchMapper, record: LiveRewrite | None):
        self._session = session
        self._mapper = mapper
        self.smart_stage = record

    @property
    def monitored_session(self):
        """The stock tf.compat.v1.train.MonitoredSession underneath."""
        return self._session

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        self._mapper.check_feeds(feed_dict)
        return self._session.run(self._mapper.map_fetches(fetches), feed_dict=feed_dict, options=options,
                                 run_metadata=run_metadata)

    def run_step_fn(self, step_fn):
        mapper = self._mapper
        return self._session.run_step_fn(lambda step_context: step_fn(_MappedStepContext(step_context, mapper)))

    def should_stop(self) -> bool:
        return self._session.should_stop()

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "SmartMonitoredSession":
        self._session.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, exc_tb):
        return self._session.__exit__(exc_type, exc_value, exc_tb)

    def __getattr__(self, name):
        return getattr(self._session, name)


def smart_hooks(graph: tf.Graph, options: SmartStageOptions, hooks=None, chief_only_hooks=None, is_chief: bool = True,
                targets=None) -> tuple[LiveRewrite | None, FetchMapper, list, list]:
    """What every monitored session does before the hooks' begin(): checks the prefetch hook, rewrites `graph`
    when `options` turn SmartStage on, and wraps the hooks so their fetches are mapped.

        before:  MonitoredSession(creator, hooks=hooks)                       # the graph as built
        after:   record, mapper, hooks, _ = smart_hooks(graph, options, hooks)  # then the stock session
    """
    hooks = list(hooks or [])
    chief_only_hooks = list(chief_only_hooks or [])
    require_prefetch_hook(graph, hooks + (chief_only_hooks if is_chief else []))
    for hook in hooks + chief_only_hooks:
        if isinstance(hook, FoldingPrefetchHook):
            hook.leave_to_session(graph)  # this session's flags decide what folds (tf_data_stage="lanes" too)
    record = prepare_graph(graph, options, targets)
    require_prefetch_hook(graph, hooks + (chief_only_hooks if is_chief else []))  # stages auto-stage inserted
    mapper = FetchMapper(record)
    if mapper.active:
        def wrap(hook):
            return hook if isinstance(hook, PrefetchHook) else _MappedHook(hook, mapper)

        hooks = [wrap(h) for h in hooks] + [_AdoptLateOpsHook(graph, record)]
        chief_only_hooks = [wrap(h) for h in chief_only_hooks]
    return record, mapper, hooks, chief_only_hooks


def MonitoredTrainingSession(  # noqa: N802  (TensorFlow's name)
    master="",
    is_chief=True,
    checkpoint_dir=None,
    scaffold=None,
    hooks=None,
    chief_only_hooks=None,
    save_checkpoint_secs=USE_DEFAULT,
    save_summaries_steps=USE_DEFAULT,
    save_summaries_secs=USE_DEFAULT,
    config=None,
    stop_grace_period_secs=120,
    log_step_count_steps=100,
    max_wait_secs=7200,
    save_checkpoint_steps=USE_DEFAULT,
    summary_dir=None,
    save_graph_def=True,
    *,
    targets=None,
) -> SmartMonitoredSession:
    """tf.compat.v1.train.MonitoredTrainingSession, with the default graph optimized when the flags are on.

        before:  tf.compat.v1.train.MonitoredTrainingSession(config=config, hooks=hooks)
        after:   ss.MonitoredTrainingSession(config=config, hooks=hooks + [ss.make_prefetch_hook()])

    Takes the stock arguments; `config` may be an ss.ConfigProto (DeepRec spelling) or a stock
    tf.compat.v1.ConfigProto, and only its stock fields reach TensorFlow. `targets`: tensors, ops or
    node names you fetch that must stay on the main side (besides the marked targets).
    """
    require_graph_mode("smartstage.MonitoredTrainingSession()", what="runs the default tf.compat.v1 graph")
    record, mapper, hooks, chief_only_hooks = smart_hooks(
        tf.compat.v1.get_default_graph(), options_from_config(config), hooks, chief_only_hooks, is_chief, targets)
    session = tf.compat.v1.train.MonitoredTrainingSession(
        master=master, is_chief=is_chief, checkpoint_dir=checkpoint_dir, scaffold=scaffold, hooks=hooks,
        chief_only_hooks=chief_only_hooks, save_checkpoint_secs=save_checkpoint_secs,
        save_summaries_steps=save_summaries_steps, save_summaries_secs=save_summaries_secs,
        config=session_config(config, master, tf.compat.v1.get_default_graph()),
        stop_grace_period_secs=stop_grace_period_secs, log_step_count_steps=log_step_count_steps,
        max_wait_secs=max_wait_secs, save_checkpoint_steps=save_checkpoint_steps, summary_dir=summary_dir,
        save_graph_def=save_graph_def,
    )
    return SmartMonitoredSession(session, mapper, record)


__all__ = ["MonitoredTrainingSession", "SmartMonitoredSession", "require_prefetch_hook", "smart_hooks"]
