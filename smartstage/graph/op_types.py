"""What op types are: OpDef facts (outputs, dtypes, statefulness) and the op-type sets every layer shares.

    output_dtypes(node)              # [DT_FLOAT, DT_INT64] from the op's OpDef and the node's attrs
    "VariableV2" in VARIABLE_OPS     # one vocabulary, as Grappler's op_types.h
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from tensorflow.core.framework import node_def_pb2, op_def_pb2, types_pb2


@functools.lru_cache(maxsize=None)
def op_def(op_type: str) -> op_def_pb2.OpDef | None:
    """The registered OpDef of an op type, or None for op types this TensorFlow does not know."""
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


# Attributes that unknown op types (DeepRec's TensorBuffer*, custom kernels) commonly use for their output types.
_FALLBACK_TYPE_LIST_ATTRS = ("dtypes", "component_types", "Toutput_types", "output_types", "Tout")


_FALLBACK_TYPE_ATTRS = ("dtype", "T", "out_type", "DstT")


class _OutputArg(NamedTuple):
    """One output argument of an OpDef, read once per op type (NodeDef attributes are read per node)."""

    type_list_attr: str
    dtype: int  # a fixed type, else 0
    type_attr: str
    default_type: int  # the type attribute's default, else 0
    number_attr: str
    default_number: int  # the number attribute's default, else -1
    is_ref: bool


@functools.lru_cache(maxsize=None)
def _output_args(op_type: str) -> tuple[_OutputArg, ...] | None:
    od = op_def(op_type)
    if od is None:
        return None
    defaults = {a.name: a.default_value for a in od.attr if a.HasField("default_value")}
    return tuple(_OutputArg(
        arg.type_list_attr, arg.type, arg.type_attr,
        defaults[arg.type_attr].type if arg.type_attr in defaults else 0,
        arg.number_attr, defaults[arg.number_attr].i if arg.number_attr in defaults else -1,
        arg.is_ref) for arg in od.output_arg)


def output_dtypes(node: node_def_pb2.NodeDef) -> list[int] | None:
    """The DataType of every output of `node`, or None when it cannot be known.

    Known op types use their OpDef; unknown ones fall back to common type attributes.
    Ref outputs (legacy variables) have the `_REF` type.
    """
    args = _output_args(node.op)
    attr = node.attr
    if args is None:
        for key in _FALLBACK_TYPE_LIST_ATTRS:
            if key in attr and attr[key].HasField("list"):
                return list(attr[key].list.type)
        for key in _FALLBACK_TYPE_ATTRS:
            if key in attr and attr[key].type:
                return [attr[key].type]
        return None
    result: list[int] = []
    for arg in args:
        if arg.type_list_attr:
            if arg.type_list_attr not in attr:
                return None
            types = list(attr[arg.type_list_attr].list.type)
        else:
            if arg.dtype:
                dtype = arg.dtype
            elif arg.type_attr in attr:
                dtype = attr[arg.type_attr].type
            elif arg.default_type:
                dtype = arg.default_type
            else:
                return None
            count = 1
            if arg.number_attr:
                if arg.number_attr in attr:
                    count = attr[arg.number_attr].i
                elif arg.default_number >= 0:
                    count = arg.default_number
                else:
                    return None
            types = [dtype] * count
        if arg.is_ref:
            types = [t + REF_DTYPE_OFFSET if t < REF_DTYPE_OFFSET else t for t in types]
        result.extend(types)
    return result


def is_stateful_op(op_type: str) -> bool | None:
    """Whether TensorFlow registers `op_type` as stateful; None for unknown op types."""
    od = op_def(op_type)
    return None if od is None else od.is_stateful


# A DataType above this is the ref type of (value - 100): DT_FLOAT_REF = 101 (legacy variables' outputs).
REF_DTYPE_OFFSET = 100
# Tensors of these types cannot be fetched as values and fed back (handles, datasets): they never cross a cut.
UNFEEDABLE_DTYPES = frozenset({types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT})


def is_ref_dtype(dtype: int | None) -> bool:
    """Whether a DataType enum is a ref type (a legacy variable's output); None (unknown) is not.

        before:  is_ref_dtype(types_pb2.DT_FLOAT_REF), is_ref_dtype(types_pb2.DT_FLOAT)
        after:   True, False
    """
    return dtype is not None and dtype > REF_DTYPE_OFFSET


_DTYPE_NAMES = {value: name[3:].lower() for name, value in types_pb2.DataType.items()}


def dtype_name(dtype: int) -> str:
    """"int64" for DT_INT64 (and "int64_ref" for its ref type); the number itself when unknown."""
    return _DTYPE_NAMES.get(dtype) or str(dtype)


QUEUE_OPS = {"FIFOQueueV2", "FIFOQueue"}


ENQUEUE_OPS = {"QueueEnqueueV2", "QueueEnqueue"}


DEQUEUE_OPS = {"QueueDequeueV2", "QueueDequeue"}


STAGING_OPS = {"Stage", "Unstage", "StageSize", "StagePeek", "StageClear"}


TENSOR_BUFFER_OPS = {"TensorBufferPut", "TensorBufferTake", "TensorBufferCancel", "TensorBufferClose", "TensorBufferSize"}


# Every op that takes a queue handle as its first input.
QUEUE_USER_OPS = ENQUEUE_OPS | DEQUEUE_OPS | {
    "QueueEnqueueManyV2", "QueueEnqueueMany", "QueueDequeueManyV2", "QueueDequeueMany", "QueueDequeueUpToV2",
    "QueueDequeueUpTo", "QueueCloseV2", "QueueClose", "QueueSizeV2", "QueueSize", "QueueIsClosedV2",
    "QueueIsClosed", "ReaderReadV2", "ReaderRead", "ReaderReadUpToV2", "ReaderReadUpTo",
}


PUT_OPS = ENQUEUE_OPS | {"Stage", "TensorBufferPut"}


TAKE_OPS = DEQUEUE_OPS | {"Unstage", "TensorBufferTake"}


FEED_OPS = {"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"}


# Ops that call back into Python (py_function, numpy_function, stateful or not): they run in the interpreter
# that built the graph, may read or change its state, and a tf.data service worker cannot run them.
PY_FUNC_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


VARIABLE_OPS = {"VariableV2", "Variable", "VarHandleOp", "_VarHandlesOp", "TemporaryVariable"}


# Ops that read a resource variable through its handle (input 0): pinned, naming the variable.
VARIABLE_READ_OPS = {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VarIsInitializedOp",
                     "DestroyResourceOp"}


MUTABLE_STATE_OPS = {
    "MutableHashTableV2", "MutableHashTable", "MutableHashTableOfTensorsV2", "MutableHashTableOfTensors",
    "MutableDenseHashTableV2", "MutableDenseHashTable", "LookupTableInsertV2", "LookupTableInsert",
    "LookupTableRemoveV2", "AnonymousMutableHashTable", "AnonymousMutableDenseHashTable",
}


# Static tables can only be initialised, never written: their handles are read-only state.
READ_ONLY_TABLE_OPS = {"HashTableV2", "HashTable"}


TABLE_READ_OPS = {"LookupTableFindV2", "LookupTableFind", "LookupTableSizeV2", "LookupTableSize"}

# Every op that takes a lookup table's handle: its reads, and what writes or dumps it.
TABLE_HANDLE_OPS = TABLE_READ_OPS | {"LookupTableInsertV2", "LookupTableRemoveV2", "LookupTableImportV2",
                                     "LookupTableExportV2"}


CONTROL_FLOW_OPS = {
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit", "NextIteration",
    "RefNextIteration", "LoopCond", "ControlTrigger", "_SwitchN",
}


FUNCTIONAL_OPS = {
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase", "PartitionedCall",
    "StatefulPartitionedCall",
}


INPUT_OPS = {
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "OptionalGetValue",
    "MultiDeviceIteratorGetNextFromShard", "QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeueMany",
    "QueueDequeueUpTo", "ReaderReadV2", "ReaderRead", "ReaderReadUpToV2", "ReaderReadUpTo",
}


STAGE_OPS = PUT_OPS | TAKE_OPS | QUEUE_OPS | STAGING_OPS | TENSOR_BUFFER_OPS


# Stateful ops that may run on the prefetch side: each runs there once per batch and nowhere else.
RANDOM_OPS = {
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
    "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "ParameterizedTruncatedNormal",
}


MOVABLE_STATEFUL_OPS = RANDOM_OPS | TABLE_READ_OPS | READ_ONLY_TABLE_OPS | {"Assert"}


ITERATOR_READS = {"IteratorGetNext", "IteratorGetNextSync"}


# Iterators a MakeIterator initializes (its dataset input names the dataset); the named ones are the graph's
# own (tf.compat.v1.data.make_initializable_iterator, Iterator.from_structure), the anonymous ones a function's.
NAMED_ITERATORS = frozenset({"IteratorV2", "Iterator"})
INITIALIZABLE_ITERATORS = NAMED_ITERATORS | {"AnonymousIterator", "AnonymousIteratorV2", "AnonymousIteratorV3"}
# An iterator that builds its dataset inside its dataset_factory function.
ONE_SHOT_ITERATORS = frozenset({"OneShotIterator"})


QUEUE_READS = {"QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeueMany", "QueueDequeueUpTo"}


READER_READS = {"ReaderReadV2", "ReaderReadUpToV2", "ReaderRead", "ReaderReadUpTo"}


SOURCE_OPS = ITERATOR_READS | QUEUE_READS | READER_READS


INITIALIZER_OPS = {"MakeIterator"}


# Ops a QueueRunner runs to fill an input queue: a source that only feeds them is read by the runner, not the step.
RUNNER_ENQUEUE_OPS = {"QueueEnqueueV2", "QueueEnqueue", "QueueEnqueueManyV2", "QueueEnqueueMany"}


# The head/body split of a prefetch side (runtime/lanes/lanes.py, passes/input_tasks.py): stateful ops whose
# result depends on their inputs only, not on how often or in which order they run, so every body run
# may run them: checks and prints, a dataset built from this batch's tensors and reduced to one element
# within the run (a per-batch storage read written in tf.data), and read-only table lookups.
ORDER_FREE_STATEFUL_OPS = {
    "Assert", "Print", "PrintV2", "NoOp", "TensorDataset", "TensorSliceDataset", "DatasetToSingleElement",
} | TABLE_READ_OPS
# Ops that only create or look up a handle (a table, a variable, a queue, an iterator, a reader).
HANDLE_OPS = {
    "HashTableV2", "HashTable", "MutableHashTableV2", "MutableHashTable", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTableV2", "VarHandleOp", "VariableV2", "Variable", "FIFOQueueV2", "FIFOQueue",
    "PaddingFIFOQueueV2", "PaddingFIFOQueue", "RandomShuffleQueueV2", "RandomShuffleQueue",
    "PriorityQueueV2", "PriorityQueue", "IteratorV2", "Iterator", "OneShotIterator", "TFRecordReaderV2",
    "TextLineReaderV2", "WholeFileReaderV2", "IdentityReaderV2", "FixedLengthRecordReaderV2",
    "LMDBReader", "Stage", "Unstage",
}
