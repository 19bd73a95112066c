"""Reading the Criteo-like CSV in a graph: queue readers or tf.data, up to the parsed columns.

    reader="queue":    string_input_producer -> TextLineReader.read_up_to -> train.batch -> decode_csv
    reader="dataset":  TextLineDataset -> repeat -> batch -> [sleep] -> [map] -> [prefetch] -> iterator
                       -> decode_csv (in the graph, or in the map)

Both readers give the same batches in the same order (one reader thread, no shuffling, a smaller
final batch dropped), so a test can swap one for the other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import tensorflow as tf

from smartstage.examples.data import ALL_COLUMNS, DENSE_COLUMNS, FIELD_DELIMITER, LABEL_COLUMN
from smartstage.examples.options import InputOptions

logger = logging.getLogger(__name__)

DatasetFn = Callable[[Mapping[str, tf.Tensor]], Mapping[str, tf.Tensor]]


@dataclass(frozen=True)
class InputPipeline:
    """The batched input of a graph.

    lines: the batch of raw CSV lines in the graph (None when parsing runs in the dataset).
    columns: the parsed columns (or, with a `dataset_fn`, what it returned), each of shape [batch].
    iterator_initializer: the initializer of an initializable iterator, else None.
    """

    lines: Optional[tf.Tensor]
    columns: Mapping[str, tf.Tensor]
    iterator_initializer: Optional[tf.Operation]


def record_defaults(columns: Sequence[str] = ALL_COLUMNS) -> list[list]:
    """decode_csv defaults: int32 label, float32 dense (NaN marks an empty field), string categorical."""
    defaults: list[list] = []
    for name in columns:
        if name == LABEL_COLUMN:
            defaults.append([0])
        elif name in DENSE_COLUMNS:
            defaults.append([float("nan")])
        else:
            defaults.append([""])
    return defaults


def parse_lines(lines: tf.Tensor, columns: Sequence[str] = ALL_COLUMNS) -> dict[str, tf.Tensor]:
    """decode_csv of a batch of lines into {column: [batch] tensor} (only `columns`, in file order)."""
    unknown = sorted(set(columns) - set(ALL_COLUMNS))
    if unknown:
        raise ValueError(f"parse_lines: unknown columns {unknown}; the file has {ALL_COLUMNS[0]}, I1..I13, C1..C26")
    ordered = [name for name in ALL_COLUMNS if name in set(columns)]
    select = None if len(ordered) == len(ALL_COLUMNS) else [ALL_COLUMNS.index(name) for name in ordered]
    values = tf.io.decode_csv(
        lines, record_defaults(ordered), field_delim=FIELD_DELIMITER, select_cols=select, name="decode_csv"
    )
    return dict(zip(ordered, values))


def _sleep(dataset: tf.data.Dataset, micros: int) -> tf.data.Dataset:
    """Delays every element by `micros`: stock SleepDataset, else a numpy_function sleep."""
    try:
        from tensorflow.python.data.experimental.ops import testing  # stock op, private Python wrapper

        return dataset.apply(testing.sleep(micros))
    except (ImportError, AttributeError):  # pragma: no cover - a TF without the wrapper
        import time

        logger.warning("SleepDataset wrapper not found; simulating storage latency with a numpy_function")

        def _wait(x):
            time.sleep(micros / 1e6)
            return x

        return dataset.map(lambda x: tf.numpy_function(_wait, [x], x.dtype, stateful=True))


def _storage_latency_ticker(micros: int) -> tf.Tensor:
    """A tensor that takes `micros` to produce on every run (a SleepDataset behind an iterator)."""
    ticks = _sleep(tf.data.Dataset.from_tensors(0).repeat(), micros)
    return tf.compat.v1.data.make_one_shot_iterator(ticks).get_next(name="storage_latency")


def _queue_lines(data_path: str, options: InputOptions) -> tf.Tensor:
    filenames = tf.compat.v1.train.string_input_producer(
        [data_path], num_epochs=options.num_epochs, shuffle=False, name="filenames"
    )
    reader = tf.compat.v1.TextLineReader(name="reader")
    _, lines = reader.read_up_to(filenames, num_records=options.batch_size, name="read")
    if options.read_latency_ms > 0:
        # The read waits for the (slow) storage; this runs in the thread that fills train.batch.
        with tf.control_dependencies([_storage_latency_ticker(int(options.read_latency_ms * 1000))]):
            lines = tf.identity(lines, name="read_done")
    batch = tf.compat.v1.train.batch(  # a one-tensor list comes back as one tensor
        [lines],
        batch_size=options.batch_size,
        num_threads=options.batch_threads,
        capacity=options.batch_capacity * options.batch_size,
        enqueue_many=True,
        name="batch",
    )
    return batch


def _dataset_iterator(data_path: str, options: InputOptions, map_fn: Optional[Callable]) -> tuple:
    dataset = tf.data.TextLineDataset(data_path)
    if options.num_epochs != 1:
        dataset = dataset.repeat(options.num_epochs)
    dataset = dataset.batch(options.batch_size, drop_remainder=True)
    if options.read_latency_ms > 0:
        dataset = _sleep(dataset, int(options.read_latency_ms * 1000))
    if map_fn is not None:
        dataset = dataset.map(map_fn)  # sequential: deterministic order
    if options.prefetch is not None:
        dataset = dataset.prefetch(tf.data.AUTOTUNE if options.prefetch == -1 else options.prefetch)
    if options.iterator == "initializable":
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        return iterator.get_next(name="next_batch"), iterator.initializer
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next(name="next_batch"), None


def read_batches(
    data_path: str,
    options: InputOptions,
    columns: Sequence[str] = ALL_COLUMNS,
    dataset_fn: Optional[DatasetFn] = None,
) -> InputPipeline:
    """Builds the reader of `options` in the default graph and returns the parsed batch.

        read_batches(path, InputOptions(reader="queue")).columns["C1"]    # [batch] tf.string

    `dataset_fn` (reader="dataset" only) runs in the dataset's map after parsing (the
    "preprocessing moved into tf.data" configuration); its result becomes `columns`.
    """
    if dataset_fn is not None and options.reader != "dataset":
        raise ValueError("read_batches: a dataset_fn needs InputOptions(reader='dataset')")
    with tf.name_scope("input"):
        if options.reader == "queue":
            lines = _queue_lines(data_path, options)
            return InputPipeline(lines=lines, columns=parse_lines(lines, columns), iterator_initializer=None)
        if options.parse_in_dataset or options.preprocess_in_dataset or dataset_fn is not None:
            def map_fn(batch: tf.Tensor) -> Mapping[str, tf.Tensor]:
                parsed = parse_lines(batch, columns)
                return dict(dataset_fn(parsed)) if dataset_fn is not None else parsed

            parsed, initializer = _dataset_iterator(data_path, options, map_fn)
            return InputPipeline(lines=None, columns=parsed, iterator_initializer=initializer)
        lines, initializer = _dataset_iterator(data_path, options, None)
        return InputPipeline(lines=lines, columns=parse_lines(lines, columns), iterator_initializer=initializer)


def finish_initialization(iterator_initializer: Optional[tf.Operation] = None) -> tf.Operation:
    """The one init op of a finished example graph: variables, local variables, tables, iterator.

    An iterator initializer also joins the LOCAL_INIT_OP collection (grouped with the default local
    init), so a MonitoredTrainingSession and an exported MetaGraphDef initialise it too. Call it
    last: variables and tables made after it are not covered.
    """
    local = [tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer()]
    if iterator_initializer is not None:
        key = tf.compat.v1.GraphKeys.LOCAL_INIT_OP
        existing = tf.compat.v1.get_collection(key)
        local_init = tf.group(*local, *existing, iterator_initializer, name="local_init")
        tf.compat.v1.get_default_graph().clear_collection(key)
        tf.compat.v1.add_to_collection(key, local_init)
    else:
        local_init = tf.group(*local, name="local_init")
    return tf.group(tf.compat.v1.global_variables_initializer(), local_init, name="init")
