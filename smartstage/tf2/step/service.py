"""service: the split step's dataset, moved preprocessing included, run on tf.data service workers (one option).

    before:  split = ss.tf2.split(step, ds)                                            # the map runs here
    after:   split = ss.tf2.split(step, ds, tf_data_service="grpc://dispatcher:5050")  # on the service's workers

The same `tf_data_service` address string the v1 path takes (SmartStageOptions.tf_data_service,
`DispatchServer.target`), and the same processing mode: `ShardingPolicy.DYNAMIC` (docs/scale-out.md, "Through
tf.data service"). The dataset the user gave, with the map of the moved part after it, is registered with the
dispatcher; each worker runs the whole pipeline on the source splits it is handed, and the step reads the
boundary tensors from the workers. What that promises, as for v1:
- each record at most once (exactly once without failures; a worker that dies loses what it was processing);
- no fixed order: batches arrive in the order workers finish them, and when the dataset batches after a
  splittable source, each worker forms its own batches from the records it got (a source whose elements are
  whole batches keeps every batch whole). `deterministic=True` of the map holds within one worker only.
- the moved part's read-only state (vocabulary tables, adapted statistics) is serialized with the dataset when
  split() registers it: tables go as they are when the split is made; re-split after changing them;
- each iteration (an epoch, each Keras fit epoch) is a new service job that sees the whole dataset once.
A `py_func` / `numpy_function` / `from_generator` in the pipeline cannot run on a worker of another process:
ConfigError naming it, before anything is registered.
"""

from __future__ import annotations

import logging

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from smartstage.errors import ConfigError
from smartstage.graph.op_types import PY_FUNC_OPS as _PY_FUNC_OPS

logger = logging.getLogger(__name__)

PROCESSING_MODE = tf.data.experimental.service.ShardingPolicy.DYNAMIC  # as passes/tfdata_service.py


def renamed_service(where: str, tf_data_service, renamed: dict):
    """tf_data_service, or the value of its old spelling `tfdata_service=` in `renamed` (a FutureWarning);
    ConfigError for any other keyword in `renamed`, or for both spellings given."""
    from smartstage.config.renamed import renamed_arguments

    return renamed_arguments(where, renamed, {"tf_data_service": tf_data_service}, {"tf_data_service": None},
                             {"tfdata_service": "tf_data_service"}, hint=f"see help(smartstage.tf2.{where[:-2]})",
                             stacklevel=3)["tf_data_service"]


def check_address(address: object) -> str:
    """The dispatcher address as distribute() takes it, or ConfigError saying what to pass.

        check_address("grpc://localhost:5050")   # -> "grpc://localhost:5050"
        check_address(5050)                      # ConfigError: tf_data_service=5050 is an int; pass ...
    """
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(f"tf_data_service={address!r} is a {type(address).__name__}; pass the dispatcher's address "
                          "as a string, 'grpc://host:port' (tf.data.experimental.service.DispatchServer(...).target)")
    return address.strip()


def _py_func_nodes(dataset: tf.data.Dataset) -> list[str]:
    """The py_func nodes of the dataset's graph and its functions (the source's, the maps'), names sorted."""
    try:  # TensorFlow's own serialization of the pipeline, the one distribute() sends to the dispatcher
        serialized = dataset._as_serialized_graph()  # noqa: SLF001
    except Exception as error:  # noqa: BLE001  (distribute() reports what the service cannot take)
        logger.debug("could not read the dataset's graph for py_func nodes: %s", error)
        return []
    graph_def = graph_pb2.GraphDef.FromString(serialized.numpy())
    found = [node.name for node in graph_def.node if node.op in _PY_FUNC_OPS]
    for function in graph_def.library.function:
        found += [f"{function.signature.name}/{node.name}" for node in function.node_def if node.op in _PY_FUNC_OPS]
    return sorted(found)


def distribute_on_service(mapped: tf.data.Dataset, address: str) -> tf.data.Dataset:
    """`mapped` (the user's dataset and the moved part's map) read from tf.data service workers.

        before:  ds.map(prefetch_side, AUTOTUNE, deterministic=True)                 # runs in this process
        after:   distribute_on_service(that, "grpc://dispatcher:5050")               # runs on the workers
    ShardingPolicy.DYNAMIC, no job name (each iteration is a new job); see the module docstring for the
    ordering and at-most-once semantics.
    """
    address = check_address(address)
    py_funcs = _py_func_nodes(mapped)
    if py_funcs:
        raise ConfigError(f"tf_data_service={address!r}: the dataset runs a Python function (node {py_funcs[0]!r}), "
                          "which a tf.data service worker in another process cannot call; drop tf_data_service, or "
                          "replace the py_func / numpy_function / from_generator with TensorFlow ops")
    logger.info("the split dataset runs on tf.data service %s (processing_mode=DYNAMIC)", address)
    return mapped.apply(tf.data.experimental.service.distribute(processing_mode=PROCESSING_MODE, service=address))


def service_line(address: str) -> str:
    """The summary line of a dataset served by tf.data service: where, and what order it keeps."""
    return (f"dataset: served by tf.data service {address} (ShardingPolicy.DYNAMIC): each record at most once, "
            "in no fixed order across workers (docs/tf2.md, 'tf.data service')")
