"""DeepRec's spelling of the SmartStage flags: `ss.ConfigProto`, TensorFlow's own ConfigProto schema copied
under the package `smartstage.deeprec` with DeepRec's fields added to OptimizerOptions.

    config = ss.ConfigProto()
    config.graph_options.optimizer_options.do_smart_stage = True      # read by config.options

Field numbers: do_smart_stage = 5001, do_smart_stage_gpu = 5002, stage_multi_stream = 5003,
smart_stage_options = 5004 (DeepRec's own numbers clash with stock fields). Every stock field keeps its
number, so a stock ConfigProto is one serialisation away.

DeepRec's other optimizer options (do_op_fusion, micro_batch_num, do_async_embedding,
embedding_layer_device_placement_optimization; 5005-5008) are fields too, so a model-zoo script that sets
them runs: they are logged once as not applied (stock TensorFlow has none of these optimizations), except
micro_batch_num > 1, which changes what each update trains on and is refused (DeepRecFeatureError).
stage_subgraph_on_cpu (5009), DeepRec's newer spelling of the GPU flag, means do_smart_stage_gpu.
"""

from __future__ import annotations

import logging

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorflow.core.protobuf import config_pb2

from smartstage.config.error_codes import OUT_OF_RANGE, error_codes
from smartstage.errors import ConfigError, DeepRecFeatureError
from smartstage.protos import AUTOTUNE

logger = logging.getLogger(__name__)

_DEEPREC_PACKAGE = "smartstage.deeprec"


_ADDED_FIELDS = {"do_smart_stage": 5001, "do_smart_stage_gpu": 5002, "stage_multi_stream": 5003}


_SMART_STAGE_OPTIONS_FIELD = 5004

# DeepRec's optimizer options that stock TensorFlow cannot apply: (field number, type).
_NOT_APPLIED_FIELDS = {"do_op_fusion": (5005, "bool"), "micro_batch_num": (5006, "int32"),
                       "do_async_embedding": (5007, "bool"),
                       "embedding_layer_device_placement_optimization": (5008, "bool")}
_STAGE_SUBGRAPH_ON_CPU_FIELD = 5009


def _build_deeprec_config_class():
    fdp = descriptor_pb2.FileDescriptorProto()
    config_pb2.DESCRIPTOR.CopyToProto(fdp)
    local = {"." + config_pb2.DESCRIPTOR.package + "." + m.name for m in fdp.message_type}

    def rename(type_name: str) -> str:
        for prefix in sorted(local, key=len, reverse=True):
            if type_name == prefix or type_name.startswith(prefix + "."):
                return "." + _DEEPREC_PACKAGE + type_name[len(".tensorflow"):]
        return type_name

    def visit(message):
        for f in message.field:
            if f.type_name:
                f.type_name = rename(f.type_name)
        for nested in message.nested_type:
            visit(nested)

    fdp.name = "smartstage/deeprec_config.proto"
    fdp.package = _DEEPREC_PACKAGE
    fdp.options.Clear()
    for message in fdp.message_type:
        visit(message)
        if message.name == "OptimizerOptions":
            for fname, number in _ADDED_FIELDS.items():
                message.field.add(name=fname, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
                                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            F = descriptor_pb2.FieldDescriptorProto
            for fname, (number, kind) in _NOT_APPLIED_FIELDS.items():
                message.field.add(name=fname, number=number, type=F.TYPE_BOOL if kind == "bool" else F.TYPE_INT32,
                                  label=F.LABEL_OPTIONAL)
            message.field.add(name="stage_subgraph_on_cpu", number=_STAGE_SUBGRAPH_ON_CPU_FIELD, type=F.TYPE_BOOL,
                              label=F.LABEL_OPTIONAL)
            message.field.add(name="smart_stage_options", number=_SMART_STAGE_OPTIONS_FIELD,
                              type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                              type_name=f".{_DEEPREC_PACKAGE}.SmartStageOptions",
                              label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    _add_smart_stage_options(fdp)
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(fdp.name)
    except KeyError:
        pool.AddSerializedFile(fdp.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(_DEEPREC_PACKAGE + ".ConfigProto"))


def _add_smart_stage_options(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    """DeepRec's SmartStageOptions (config.proto), field for field: what tf.SmartStageOptions() returns."""
    F = descriptor_pb2.FieldDescriptorProto
    optional, repeated = F.LABEL_OPTIONAL, F.LABEL_REPEATED

    def message(name: str, fields: list[tuple]) -> None:
        m = fdp.message_type.add(name=name)
        for number, (fname, ftype, label, *type_name) in enumerate(fields, start=1):
            m.field.add(name=fname, number=number, type=ftype, label=label,
                        **({"type_name": f".{_DEEPREC_PACKAGE}.{type_name[0]}"} if type_name else {}))

    message("StageSubgraphRunOptions", [("use_stage_subgraph_thread_pool", F.TYPE_BOOL, optional),
                                        ("stage_subgraph_thread_pool_id", F.TYPE_INT32, optional)])
    message("PrefetchRunnerOptions", [("closed_exceptions", F.TYPE_INT32, repeated),
                                      ("ignored_exceptions", F.TYPE_INT32, repeated),
                                      ("run_options", F.TYPE_MESSAGE, optional, "StageSubgraphRunOptions")])
    message("SmartStageOptions", [("capacity", F.TYPE_INT64, optional), ("num_threads", F.TYPE_INT32, optional),
                                  ("num_clients", F.TYPE_INT32, optional), ("timeout_millis", F.TYPE_INT64, optional),
                                  ("runner_options", F.TYPE_MESSAGE, optional, "PrefetchRunnerOptions"),
                                  ("stage_subgraph_stream_id", F.TYPE_INT32, optional),
                                  ("graph_key", F.TYPE_INT64, optional), ("name", F.TYPE_STRING, optional)])


ConfigProto = _build_deeprec_config_class()
ConfigProto.__doc__ = (
    "TensorFlow's ConfigProto with DeepRec's SmartStage flags: "
    "config.graph_options.optimizer_options.do_smart_stage = True. Convert with to_session_config()."
)


SmartStageOptionsProto = message_factory.GetMessageClass(
    descriptor_pool.Default().FindMessageTypeByName(_DEEPREC_PACKAGE + ".SmartStageOptions"))


_TUNABLE_OPTIONS = ("capacity", "num_threads")  # may be AUTOTUNE


def deeprec_smart_stage_options(capacity: int = AUTOTUNE, num_threads: int = AUTOTUNE, num_clients: int = 1,
                                timeout_millis: int = 300000, closed_exception_types=(OUT_OF_RANGE,),
                                ignored_exception_types=(), use_stage_subgraph_thread_pool: bool = False,
                                stage_subgraph_thread_pool_id: int | None = None, stage_subgraph_stream_id: int = 0,
                                graph=None, name: str | None = None):
    """DeepRec's `tf.SmartStageOptions(...)`: the options message that turns auto-stage on in an ss.ConfigProto.

        before:  config.graph_options.optimizer_options.do_smart_stage = True      # needs a staged() stage
        after:   config.graph_options.optimizer_options.smart_stage_options.CopyFrom(
                     tf.SmartStageOptions(capacity=8, num_threads=2))           # from smartstage.compat import tf

    Same arguments and checks as DeepRec's; what is not given is AUTOTUNE (-1, as in staged()): capacity and
    num_threads (DeepRec's 1 and 1 are one lane and one batch ahead), and the pool without
    use_stage_subgraph_thread_pool and an index (recorded as index -1). Values given are kept as given.
    `graph` is accepted and ignored (the session's own graph is the one optimized). Exception types are
    tf.errors classes or codes.
    """
    if stage_subgraph_thread_pool_id is None:  # not given: DeepRec's pool 0 when a pool is asked for, else AUTOTUNE
        stage_subgraph_thread_pool_id = 0 if use_stage_subgraph_thread_pool else AUTOTUNE
    for label, value, least in (("capacity", capacity, 1), ("num_threads", num_threads, 1),
                                ("num_clients", num_clients, 1), ("timeout_millis", timeout_millis, 1),
                                ("stage_subgraph_thread_pool_id", stage_subgraph_thread_pool_id, AUTOTUNE),
                                ("stage_subgraph_stream_id", stage_subgraph_stream_id, 0)):
        tunable = label in _TUNABLE_OPTIONS
        if isinstance(value, bool) or not isinstance(value, int) or (
                value < least and not (tunable and value == AUTOTUNE)):
            either = " or ss.AUTOTUNE (-1)" if tunable else ""
            raise ConfigError(f"SmartStageOptions: {label}={value!r}; pass an integer >= {least}{either}")
    options = SmartStageOptionsProto(capacity=capacity, num_threads=num_threads, num_clients=num_clients,
                                     timeout_millis=timeout_millis, stage_subgraph_stream_id=stage_subgraph_stream_id,
                                     name=name or "smart_stage")
    runner = options.runner_options
    runner.closed_exceptions.extend(error_codes(closed_exception_types, "SmartStageOptions(closed_exception_types)"))
    runner.ignored_exceptions.extend(error_codes(ignored_exception_types, "SmartStageOptions(ignored_exception_types)"))
    runner.run_options.use_stage_subgraph_thread_pool = use_stage_subgraph_thread_pool
    runner.run_options.stage_subgraph_thread_pool_id = stage_subgraph_thread_pool_id
    return options


_logged_not_applied: set[str] = set()


def refuse_micro_batch(optimizer_options) -> None:
    """Raises DeepRecFeatureError for micro_batch_num > 1: the one DeepRec optimizer option whose absence changes
    what the model trains on (the others only change speed, and are logged as not applied).

        before:  optimizer_options.micro_batch_num = 2   # ignored: the zoo's half-size batches trained one by one
        after:   DeepRecFeatureError: ...micro_batch_num=2 is DeepRec-only (...): run the script with --micro_batch 0 ...
    """
    micro_batch_num = getattr(optimizer_options, "micro_batch_num", 0)
    if micro_batch_num > 1:
        raise DeepRecFeatureError(
            f"ConfigProto.graph_options.optimizer_options.micro_batch_num={micro_batch_num} is DeepRec-only "
            "(DeepRec's Auto Micro Batch runs N copies of the step and sums their gradients into one update, so "
            "the model zoo's batch_size / N per copy trains as one full batch; stock TensorFlow would update on "
            "each micro-batch); stock TensorFlow has no equivalent: run the script with --micro_batch 0 (leave it "
            "out) and the full --batch_size")


def deeprec_gpu_flag(optimizer_options) -> bool:
    """DeepRec's GPU flag in either spelling (do_smart_stage_gpu, or the newer stage_subgraph_on_cpu); logs, once
    per option, each DeepRec optimizer option set in the config that stock TensorFlow cannot apply, and refuses
    micro_batch_num > 1 (refuse_micro_batch).

        before:  config.graph_options.optimizer_options.do_op_fusion = True   # AttributeError on stock TF
        after:   accepted; "do_op_fusion=True ... not applied" logged once
    """
    refuse_micro_batch(optimizer_options)
    for fname in _NOT_APPLIED_FIELDS:
        value = getattr(optimizer_options, fname)
        if value and fname not in _logged_not_applied:
            _logged_not_applied.add(fname)
            logger.warning("ConfigProto optimizer_options.%s=%s is a DeepRec optimization stock TensorFlow does not "
                           "have: accepted, not applied", fname, value)
    return optimizer_options.do_smart_stage_gpu or optimizer_options.stage_subgraph_on_cpu


def is_deeprec_config(config) -> bool:
    return getattr(getattr(config, "DESCRIPTOR", None), "full_name", "") == _DEEPREC_PACKAGE + ".ConfigProto"


__all__ = ["ConfigProto", "SmartStageOptionsProto", "deeprec_smart_stage_options"]
