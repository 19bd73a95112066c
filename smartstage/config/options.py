"""The SmartStage flags, read from either config spelling, and the stock ConfigProto a Session takes.

Two spellings mean the same:

    config = tf.compat.v1.ConfigProto()                  # stock: Grappler's custom-optimizer convention
    ss.enable_smart_stage(config)                        # adds custom_optimizers {name: "SmartStage"
                                                         #   parameter_map {key: "do_smart_stage" value {b: true}}}

    config = ss.ConfigProto()                            # DeepRec's spelling, on SmartStage's own message
    config.graph_options.optimizer_options.do_smart_stage = True

`ss.ConfigProto` is TensorFlow's own ConfigProto schema, copied under the package `smartstage.deeprec`
with fields added to OptimizerOptions (do_smart_stage = 5001, do_smart_stage_gpu = 5002,
stage_multi_stream = 5003, smart_stage_options = 5004; DeepRec's own numbers clash with stock fields).
Every stock field keeps its number, so `to_session_config()` converts by serialising, and the flags
never reach TensorFlow.

Auto-stage (a stage at every input source, no staged() needed), both spellings:

    ss.enable_smart_stage(config, auto_stage=ss.AutoStageOptions(capacity=8, num_threads=2))

    from smartstage.compat import tf                     # DeepRec: import tensorflow as tf
    config = tf.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True
    config.graph_options.optimizer_options.smart_stage_options.CopyFrom(tf.SmartStageOptions(capacity=8))
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from typing import Any

from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.protobuf import config_pb2

from smartstage.config.error_codes import OUT_OF_RANGE, error_codes
from smartstage.errors import ConfigError
from smartstage.protos import AUTOTUNE
from smartstage.config.deeprec import is_deeprec_config, deeprec_gpu_flag, deeprec_smart_stage_options
from smartstage.config.renamed import (ENABLE_RENAMES, INPUT_MODE_RENAMES, OPTION_RENAMES, renamed_arguments,
                                       renamed_fields, renamed_input_mode, renamed_keywords)

OPTIMIZER_NAME = "SmartStage"


@dataclass(frozen=True)
class AutoStageOptions:
    """Options of the stages that auto-stage inserts at input sources (mirrors DeepRec's SmartStageOptions).

    closed_exception_types / ignored_exception_types: tf.errors classes or codes, as staged() takes them;
    by default the end of input (OutOfRangeError) closes a stage.
    """

    # AUTOTUNE (smartstage.AUTOTUNE): the prefetch threads pick num_threads, the capacity and the pool (the
    # shared one or the session's prefetch pool) while training, batches in input order either way
    # (docs/runtime.md). The pool takes what staged() takes, with staged()'s defaults:
    # use_stage_subgraph_thread_pool True (pool stage_subgraph_thread_pool_id), False (the session's shared
    # pool) or AUTOTUNE (tried while training; so is an index of AUTOTUNE). A tuned pool is recorded as
    # (AUTOTUNE, AUTOTUNE), so every spelling of it compares equal.
    capacity: int = AUTOTUNE
    num_threads: int = AUTOTUNE
    num_clients: int = 1
    timeout_millis: int = 300000
    closed_exception_types: tuple = (OUT_OF_RANGE,)
    ignored_exception_types: tuple = ()
    use_stage_subgraph_thread_pool: bool | int = AUTOTUNE
    stage_subgraph_thread_pool_id: int = 0
    stage_subgraph_stream_id: int = 0
    name: str = "smart_stage"

    def __post_init__(self) -> None:
        use = self.use_stage_subgraph_thread_pool
        if not isinstance(use, bool) and use != AUTOTUNE:
            raise ConfigError(f"AutoStageOptions(): use_stage_subgraph_thread_pool={use!r}; pass True, False or "
                              "smartstage.AUTOTUNE, as staged() takes")
        if self.tuned_pool:
            object.__setattr__(self, "use_stage_subgraph_thread_pool", AUTOTUNE)
            object.__setattr__(self, "stage_subgraph_thread_pool_id", AUTOTUNE)

    @property
    def tuned_pool(self) -> bool:
        """The pool is tried while training: staged()'s rule, either setting AUTOTUNE."""
        use = self.use_stage_subgraph_thread_pool
        return (not isinstance(use, bool) and use == AUTOTUNE) or self.stage_subgraph_thread_pool_id == AUTOTUNE


@renamed_fields(OPTION_RENAMES)
@dataclass(frozen=True)
class SmartStageOptions:
    """The effective flags of one optimize() call."""

    do_smart_stage: bool = False
    do_smart_stage_gpu: bool = False
    stage_multi_stream: bool = False
    auto_stage: AutoStageOptions | None = None
    verify: bool = True
    source: str = "default"  # where the flags came from, for the report
    # Scale-out (docs/scale-out.md): the prefetch side on the tasks of this job of the cluster.
    input_job: str | None = None
    input_tasks: int = 0                # tasks of input_job; 0: read from the config's cluster_def
    input_mode: str = "central"         # "central" (the trainer reads, tasks compute), "sharded" or "tf_data_service"
    input_num_threads_per_task: int = 1  # central mode: the prefetch threads (lanes) that run on each task
    input_timeout_millis: int = 60000   # a prefetch run on an input task fails after this long
    # input_mode="tf_data_service": the tf.data service's dispatcher, "grpc://host:port" (what
    # tf.data.experimental.service.distribute takes as `service`). Not tf_data_stage: that one says how a
    # stage reading a tf.data iterator runs in this process.
    tf_data_service: str | None = None
    # Whether the sessions that run the optimized graph rewrite it with Grappler (the config's
    # rewrite_options.disable_meta_optimizer off): a body folded into a dataset's map is rewritten the same
    # way, so the moved ops give the values they give in the step.
    session_rewrites: bool = True
    # A stage whose prefetch side reads a tf.data iterator: "fold" runs the moved work as the dataset's
    # deterministic map + prefetch (passes/fold_dataset.py; restores exactly, no thread of ours); "lanes"
    # keeps the stage and runs it with the prefetch threads (kept for comparison).
    tf_data_stage: str = "fold"
    # False: every stage keeps the prefetch side it was built with (no expand_stage); a session with the flag
    # off runs the passes this way, so that only tf_data_stage="fold" changes its graph (session/session.py).
    expand: bool = True

    @property
    def enabled(self) -> bool:
        return self.do_smart_stage or self.do_smart_stage_gpu or self.auto_stage is not None


def _auto_stage_from_deeprec(message) -> AutoStageOptions:
    runner = message.runner_options
    return AutoStageOptions(
        capacity=message.capacity or AUTOTUNE, num_threads=message.num_threads or AUTOTUNE,
        num_clients=message.num_clients or 1,
        timeout_millis=message.timeout_millis or 300000,
        closed_exception_types=tuple(runner.closed_exceptions) if runner.closed_exceptions else (OUT_OF_RANGE,),
        ignored_exception_types=tuple(runner.ignored_exceptions),
        # DeepRec's message holds a bool and an index; an index of AUTOTUNE (what deeprec_smart_stage_options
        # records when no pool is asked for) is a tuned pool, as in staged()
        use_stage_subgraph_thread_pool=runner.run_options.use_stage_subgraph_thread_pool,
        stage_subgraph_thread_pool_id=runner.run_options.stage_subgraph_thread_pool_id,
        stage_subgraph_stream_id=message.stage_subgraph_stream_id, name=message.name or "smart_stage")


def _custom_optimizer(config: config_pb2.ConfigProto, create: bool = False):
    rewrite = config.graph_options.rewrite_options
    for entry in rewrite.custom_optimizers:
        if entry.name == OPTIMIZER_NAME:
            return entry
    return rewrite.custom_optimizers.add(name=OPTIMIZER_NAME) if create else None


_AUTO_INT_PARAMETERS = ("capacity", "num_threads", "num_clients", "timeout_millis", "stage_subgraph_thread_pool_id",
                        "stage_subgraph_stream_id")
_AUTO_LIST_PARAMETERS = ("closed_exception_types", "ignored_exception_types")
_INPUT_INT_PARAMETERS = ("input_tasks", "input_num_threads_per_task", "input_timeout_millis")
_INPUT_MODES = ("central", "sharded", "tf_data_service")
TF_DATA_STAGES = ("fold", "lanes")
_KNOWN_PARAMETERS = ("do_smart_stage", "do_smart_stage_gpu", "stage_multi_stream", "auto_stage", "verify",
                     "auto_stage_name", "auto_stage_use_stage_subgraph_thread_pool",
                     *("auto_stage_" + k for k in _AUTO_INT_PARAMETERS + _AUTO_LIST_PARAMETERS),
                     "input_job", "input_mode", "tf_data_service", "tf_data_stage", *_INPUT_INT_PARAMETERS)


def _attr_bool(key: str, value: attr_value_pb2.AttrValue) -> bool:
    kind = value.WhichOneof("value")
    if kind == "b":
        return value.b
    if kind == "i" and value.i in (0, 1):
        return bool(value.i)
    if kind == "s" and value.s.lower() in (b"true", b"false", b"1", b"0"):
        return value.s.lower() in (b"true", b"1")
    raise ConfigError(f"SmartStage custom optimizer parameter {key!r} must be a bool (AttrValue b), got {kind}: {value}")


def _attr_int(key: str, value: attr_value_pb2.AttrValue) -> int:
    if value.WhichOneof("value") != "i":
        raise ConfigError(f"SmartStage custom optimizer parameter {key!r} must be an int (AttrValue i), got {value}")
    return value.i


def _attr_int_list(key: str, value: attr_value_pb2.AttrValue) -> tuple[int, ...]:
    if value.WhichOneof("value") != "list":
        raise ConfigError(f"SmartStage custom optimizer parameter {key!r} must be a list of ints (AttrValue list.i), "
                          f"got {value}")
    return tuple(value.list.i)


def options_from_config(config=None, **overrides: Any) -> SmartStageOptions:
    """The SmartStage flags of a stock tf.compat.v1.ConfigProto, an ss.ConfigProto, or None (all off).

    >>> options_from_config(enable_smart_stage(tf.compat.v1.ConfigProto())).do_smart_stage
    True
    """
    options = SmartStageOptions()
    if config is None:
        pass
    elif is_deeprec_config(config):
        oo = config.graph_options.optimizer_options
        gpu = deeprec_gpu_flag(oo)  # also stage_subgraph_on_cpu; logs DeepRec options not applied
        on = oo.do_smart_stage or gpu
        auto = _auto_stage_from_deeprec(oo.smart_stage_options) if on and oo.HasField("smart_stage_options") else None
        options = SmartStageOptions(do_smart_stage=oo.do_smart_stage, do_smart_stage_gpu=gpu,
                                    stage_multi_stream=oo.stage_multi_stream, auto_stage=auto, source="ss.ConfigProto")
    elif isinstance(config, config_pb2.ConfigProto):
        entry = _custom_optimizer(config)
        if entry is not None:
            params = renamed_keywords("custom_optimizers parameter_map", dict(entry.parameter_map))
            unknown = sorted(set(params) - set(_KNOWN_PARAMETERS))
            if unknown:
                raise ConfigError(f"unknown SmartStage parameter(s) {unknown} in rewrite_options.custom_optimizers; "
                                  f"known: {list(_KNOWN_PARAMETERS)}")
            flags = {k: _attr_bool(k, params[k]) for k in ("do_smart_stage", "do_smart_stage_gpu",
                                                            "stage_multi_stream", "verify") if k in params}
            auto = None
            if params.get("auto_stage") is not None and _attr_bool("auto_stage", params["auto_stage"]):
                fields: dict[str, Any] = {k: _attr_int("auto_stage_" + k, params["auto_stage_" + k])
                                          for k in _AUTO_INT_PARAMETERS if "auto_stage_" + k in params}
                fields.update({k: _attr_int_list("auto_stage_" + k, params["auto_stage_" + k])
                               for k in _AUTO_LIST_PARAMETERS if "auto_stage_" + k in params})
                if "auto_stage_use_stage_subgraph_thread_pool" in params:
                    fields["use_stage_subgraph_thread_pool"] = _attr_bool(
                        "auto_stage_use_stage_subgraph_thread_pool", params["auto_stage_use_stage_subgraph_thread_pool"])
                if "auto_stage_name" in params:
                    fields["name"] = params["auto_stage_name"].s.decode()
                auto = AutoStageOptions(**fields)
            flags.update(_input_parameters(params))
            options = SmartStageOptions(auto_stage=auto, source="custom_optimizers", **flags)
    elif isinstance(config, SmartStageOptions):
        options = config
    else:
        raise ConfigError(f"config must be a tf.compat.v1.ConfigProto, an ss.ConfigProto or None, "
                          f"not {type(config).__name__}")
    if isinstance(config, config_pb2.ConfigProto) or is_deeprec_config(config):
        options = replace(options, session_rewrites=not config.graph_options.rewrite_options.disable_meta_optimizer)
    overrides = renamed_keywords("options_from_config()", overrides) if overrides else overrides
    options = replace(options, **overrides) if overrides else options
    if options.input_mode in INPUT_MODE_RENAMES:
        options = replace(options, input_mode=renamed_input_mode("SmartStage options", options.input_mode))
    if options.tf_data_stage not in TF_DATA_STAGES:
        raise ConfigError(f"SmartStage parameter 'tf_data_stage' must be one of {list(TF_DATA_STAGES)}, not "
                          f"{options.tf_data_stage!r}: 'fold' runs a tf.data stage's moved work in its dataset, "
                          "'lanes' keeps the prefetch threads")
    return _checked_input_options(options, config)


def _input_parameters(params: dict) -> dict[str, Any]:
    """The scale-out parameters of a custom-optimizer entry (input_job="input", input_tasks=4, ...)."""
    fields: dict[str, Any] = {k: _attr_int(k, params[k]) for k in _INPUT_INT_PARAMETERS if k in params}
    for key in ("input_job", "input_mode", "tf_data_service", "tf_data_stage"):
        if key in params:
            if params[key].WhichOneof("value") != "s":
                raise ConfigError(f"SmartStage custom optimizer parameter {key!r} must be a string (AttrValue s), "
                                  f"got {params[key]}")
            fields[key] = params[key].s.decode() or None
    return fields


def _checked_input_options(options: SmartStageOptions, config) -> SmartStageOptions:
    """input_job's task count from the config's cluster_def when not given; bad values named."""
    if options.input_mode == "tf_data_service" or options.tf_data_service:
        return _checked_service_options(options)
    if not options.input_job:
        return options
    if options.input_mode not in _INPUT_MODES:
        raise ConfigError(f"input_mode must be one of {list(_INPUT_MODES)}, not {options.input_mode!r}")
    tasks = options.input_tasks
    cluster = getattr(config, "cluster_def", None)
    if not tasks and cluster is not None:
        for job in cluster.job:
            if job.name == options.input_job:
                tasks = len(job.tasks)
    if tasks < 1:
        raise ConfigError(f"input_job={options.input_job!r} needs the number of its tasks: pass input_tasks=N "
                          f"(or a ConfigProto whose cluster_def has job {options.input_job!r})")
    if options.input_num_threads_per_task < 1 or options.input_timeout_millis < 1:
        raise ConfigError("input_num_threads_per_task and input_timeout_millis must be positive, got "
                          f"{options.input_num_threads_per_task} and {options.input_timeout_millis}")
    return replace(options, input_tasks=tasks)


# A dispatcher address as DispatchServer.target gives it: grpc://host:port (host a name, IPv4 or [IPv6]).
_DISPATCHER_ADDRESS = re.compile(r"^(?:grpc://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):\d{1,5}$")


def _checked_service_options(options: SmartStageOptions) -> SmartStageOptions:
    """input_mode="tf_data_service" with tf_data_service="grpc://host:port", and nothing of the input-job modes."""
    address = options.tf_data_service
    if options.input_mode != "tf_data_service":
        raise ConfigError(f"tf_data_service={address!r} is set but input_mode is {options.input_mode!r}; pass "
                          "input_mode='tf_data_service' to distribute the input through tf.data service, or drop "
                          "tf_data_service")
    if not address:
        raise ConfigError("input_mode='tf_data_service' needs the dispatcher's address: pass "
                          "tf_data_service='grpc://host:port' (DispatchServer.target)")
    if options.input_job:
        raise ConfigError(f"input_job={options.input_job!r} names cluster tasks, which input_mode='tf_data_service' "
                          "does not use (the service's workers run the input); drop input_job, or use "
                          "input_mode='central' or 'sharded'")
    if not _DISPATCHER_ADDRESS.match(address):
        raise ConfigError(f"tf_data_service={address!r} is not a dispatcher address; pass 'grpc://host:port' "
                          "(what DispatchServer.target returns)")
    return replace(options, tf_data_service=address if address.startswith("grpc://") else f"grpc://{address}")


def enable_smart_stage(config=None, *, do_smart_stage_gpu: bool = False, stage_multi_stream: bool = False,
                       auto_stage: AutoStageOptions | bool | None = None, input_job: str | None = None,
                       input_tasks: int = 0, input_mode: str = "central", tf_data_service: str | None = None,
                       tf_data_stage: str | None = None, **renamed: Any):
    """Turns SmartStage on in `config` (created if None) and returns it.

    do_smart_stage_gpu / stage_multi_stream: DeepRec's flags of the same names (docs/gpu.md).
    tf_data_stage: "fold" (the default when None) or "lanes": how a stage that reads a tf.data iterator runs
    in this process (parameter_map key `tf_data_stage`; no DeepRec spelling).
    tf_data_service: the dispatcher address ("grpc://host:port") the input runs on, with
    input_mode="tf_data_service" (docs/scale-out.md).
    renamed: the old spellings gpu=, multi_stream= and tfdata_service= (one release, with a FutureWarning).

    before:  ConfigProto()                      -> optimize() returns the graph unchanged
    after:   enable_smart_stage(ConfigProto())  -> optimize() expands every stage
    """
    given = {"do_smart_stage_gpu": do_smart_stage_gpu, "stage_multi_stream": stage_multi_stream,
             "tf_data_service": tf_data_service}
    defaults = {"do_smart_stage_gpu": False, "stage_multi_stream": False, "tf_data_service": None}
    do_smart_stage_gpu, stage_multi_stream, tf_data_service = renamed_arguments(
        "enable_smart_stage()", renamed, given, defaults, ENABLE_RENAMES,
        hint=f"it takes {list(inspect.signature(enable_smart_stage).parameters)[1:-1]}").values()
    input_mode = renamed_input_mode("enable_smart_stage()", input_mode)
    if config is None:
        config = config_pb2.ConfigProto()
    if auto_stage is True:
        auto_stage = AutoStageOptions()
    if is_deeprec_config(config):
        if input_job or tf_data_service or tf_data_stage:
            which = "input_job" if input_job else "tf_data_service" if tf_data_service else "tf_data_stage"
            raise ConfigError(f"{which} has no DeepRec spelling: use a stock tf.compat.v1.ConfigProto "
                              f"(custom_optimizers) or optimize(..., {which}=...)")
        oo = config.graph_options.optimizer_options
        if auto_stage:
            oo.smart_stage_options.CopyFrom(deeprec_smart_stage_options(
                auto_stage.capacity, auto_stage.num_threads, auto_stage.num_clients, auto_stage.timeout_millis,
                error_codes(auto_stage.closed_exception_types, "AutoStageOptions.closed_exception_types"),
                error_codes(auto_stage.ignored_exception_types, "AutoStageOptions.ignored_exception_types"),
                auto_stage.use_stage_subgraph_thread_pool is True, auto_stage.stage_subgraph_thread_pool_id,
                auto_stage.stage_subgraph_stream_id, name=auto_stage.name))
        oo.do_smart_stage = True
        oo.do_smart_stage_gpu = oo.do_smart_stage_gpu or do_smart_stage_gpu
        oo.stage_multi_stream = oo.stage_multi_stream or stage_multi_stream
        return config
    if not isinstance(config, config_pb2.ConfigProto):
        raise ConfigError(f"enable_smart_stage takes a tf.compat.v1.ConfigProto or ss.ConfigProto, "
                          f"not {type(config).__name__}")
    params = _custom_optimizer(config, create=True).parameter_map
    params["do_smart_stage"].b = True
    if input_job:
        params["input_job"].s = input_job.encode()
        params["input_mode"].s = input_mode.encode()
        if input_tasks:
            params["input_tasks"].i = input_tasks
    if tf_data_service or input_mode == "tf_data_service":
        params["input_mode"].s = input_mode.encode()
        if tf_data_service:
            params["tf_data_service"].s = tf_data_service.encode()
    if tf_data_stage is not None:
        if tf_data_stage not in TF_DATA_STAGES:
            raise ConfigError(f"enable_smart_stage(tf_data_stage={tf_data_stage!r}): 'tf_data_stage' must be one of "
                              f"{list(TF_DATA_STAGES)}")
        params["tf_data_stage"].s = tf_data_stage.encode()
    if do_smart_stage_gpu:
        params["do_smart_stage_gpu"].b = True
    if stage_multi_stream:
        params["stage_multi_stream"].b = True
    if auto_stage:
        params["auto_stage"].b = True
        for key in _AUTO_INT_PARAMETERS:
            params["auto_stage_" + key].i = getattr(auto_stage, key)
        for key in _AUTO_LIST_PARAMETERS:
            codes = error_codes(getattr(auto_stage, key), f"AutoStageOptions.{key}")
            params["auto_stage_" + key].list.i[:] = codes
        # a tuned pool travels as its index (AUTOTUNE); the bool says whether a given index is used
        params["auto_stage_use_stage_subgraph_thread_pool"].b = auto_stage.use_stage_subgraph_thread_pool is True
        params["auto_stage_name"].s = auto_stage.name.encode()
    return config


def to_session_config(config=None) -> config_pb2.ConfigProto:
    """The stock ConfigProto a tf.compat.v1.Session takes: every stock field kept, SmartStage's flags dropped.

    Stock TensorFlow accepts an unknown custom optimizer entry, but Grappler then logs an error for it on
    every session; the entry is removed here.
    """
    if config is None:
        return config_pb2.ConfigProto()
    stock = config_pb2.ConfigProto()
    if is_deeprec_config(config):
        stock.ParseFromString(config.SerializeToString())
        stock.DiscardUnknownFields()
        return stock
    if not isinstance(config, config_pb2.ConfigProto):
        raise ConfigError(f"expected a tf.compat.v1.ConfigProto or ss.ConfigProto, not {type(config).__name__}")
    stock.CopyFrom(config)
    rewrite = stock.graph_options.rewrite_options
    kept = [e for e in rewrite.custom_optimizers if e.name != OPTIMIZER_NAME]
    del rewrite.custom_optimizers[:]
    rewrite.custom_optimizers.extend(kept)
    return stock


__all__ = ["AutoStageOptions", "SmartStageOptions", "enable_smart_stage", "options_from_config", "to_session_config",
           "OPTIMIZER_NAME"]
