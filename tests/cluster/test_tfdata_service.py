"""input_mode="tf_data_service" on an in-process tf.data service: a dispatcher and 2 workers on localhost.

    range -> map -> batch => iterator -> staged() ~~ take -> sqrt/log1p(x), hash(name) -> fetched
    optimized: range -> map -> batch -> map(sqrt/log1p, hash) -> service (2 workers) => iterator -> put ~~ take

    every (row, x, id) of the unoptimized run exactly once in the optimized run (a multiset: dynamic
    sharding keeps no order and forms batches per worker); a table lookup in the body leaves the stage alone

TensorFlow's DispatchServer and WorkerServer have no bind-address setting (they listen on every
interface); every address they are given or hand out here is localhost. Each session run is bounded by
RunOptions(timeout_in_ms), and the servers are stopped when the module's tests end.
"""

from __future__ import annotations

from collections import Counter

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.passes.tfdata_service import SCOPE
from tests.bounds import HANG_MILLIS

pytestmark = [pytest.mark.cluster]

ROWS, BATCH = 40, 4
STEP_MILLIS = HANG_MILLIS
FETCHES = ["rows:0", "x_out:0", "ids:0"]


@pytest.fixture(scope="module")
def service():
    """grpc://localhost:<port> of a dispatcher with 2 workers; both stopped after the module."""
    service_lib = tf.data.experimental.service
    dispatcher = service_lib.DispatchServer(service_lib.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = [service_lib.WorkerServer(service_lib.WorkerConfig(
        dispatcher_address=address, worker_address="localhost:%port%", port=0)) for _ in range(2)]
    try:
        yield dispatcher.target
    finally:
        for worker in workers:
            worker._stop()  # TensorFlow's own tests stop servers this way; there is no public stop
        dispatcher._stop()


def input_graph(lookup: bool = False) -> tf.compat.v1.MetaGraphDef:
    #   range(ROWS) -> map(row -> x, name) -> batch(BATCH) => MakeIterator/IteratorV2 -> IteratorGetNext
    #     -> staged() ~~ take -> x_out = log1p(sqrt(x + 1)) * 3 ; ids = hash(name) [or table.lookup(name)]
    #                         \-> rows
    graph = tf.Graph()
    with graph.as_default():
        ds = tf.data.Dataset.range(ROWS).map(lambda i: {
            "row": i, "x": tf.cast(tf.stack([i, i * i % 7]), tf.float32), "name": tf.strings.as_string(i % 11)})
        iterator = tf.compat.v1.data.make_initializable_iterator(ds.batch(BATCH))
        f = ss.staged(iterator.get_next(), capacity=2, num_threads=1)
        tf.identity(tf.math.log1p(tf.sqrt(f["x"] + 1.0)) * 3.0, name="x_out")
        if lookup:
            table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                [str(i) for i in range(11)], list(range(11)), value_dtype=tf.int64), -1)
            tf.identity(table.lookup(f["name"]), name="ids")
        else:
            tf.identity(tf.strings.to_hash_bucket_fast(f["name"], 13), name="ids")
        tf.identity(f["row"], name="rows")
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def optimized(meta, address: str):
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), input_mode="tf_data_service", tf_data_service=address)
    result = ss.optimize(meta, config, targets=[f.split(":")[0] for f in FETCHES])
    (report,) = [r for r in result.reports if r.name == "tfdata_service"]
    return result, report


def records(meta) -> tuple[Counter, int]:
    """Every (row, x, id) the graph's steps fetch until the end of input, and the number of steps."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
        init = [graph.get_operation_by_name("MakeIterator"), tf.compat.v1.tables_initializer()]
    bounded = tf.compat.v1.RunOptions(timeout_in_ms=STEP_MILLIS)
    seen, steps = Counter(), 0
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init, options=bounded)
        with ss.start_prefetch_threads(sess):
            for steps in range(4 * ROWS):  # bounded: far more steps than batches
                try:
                    rows, x, ids = sess.run(FETCHES, options=bounded)
                except tf.errors.OutOfRangeError:
                    break
                seen.update(zip(rows.tolist(), map(tuple, x.tolist()), ids.tolist()))
    return seen, steps


def assert_same_records(seen: Counter, expected: Counter) -> None:
    """The same (row, id) multiset exactly; x per row to float rounding: the body's kernels ran on batches
    formed per worker, and a batch of another size can round the last bit differently (seen: 1 ulp)."""
    assert Counter((row, i) for (row, _, i), n in seen.items() for _ in range(n)) == Counter(
        (row, i) for (row, _, i), n in expected.items() for _ in range(n))
    x_seen, x_expected = ({row: x for row, x, _ in records} for records in (seen, expected))
    for row, x in x_expected.items():
        assert x_seen[row] == pytest.approx(x, rel=1e-6, abs=0.0), row


def test_service_run_gives_every_record_of_the_unoptimized_graph_once(service):
    meta = input_graph()
    result, report = optimized(meta, service)
    assert report.changed, report.summary
    expected, expected_steps = records(meta)
    seen, steps = records(result.meta_graph_def)
    assert sum(expected.values()) == ROWS and expected_steps == ROWS // BATCH
    assert_same_records(seen, expected)  # each row once, with the body's values computed on the workers
    assert steps >= expected_steps  # batches form per worker: a partial one each at the end at most


def test_the_body_runs_inside_the_distributed_dataset(service):
    result, _ = optimized(input_graph(), service)
    graph_def = result.graph_def
    nodes = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    scope = f"stage/{SCOPE}/"
    folded = nodes[scope + "MapDataset"]
    body_ops = {n.op for n in functions[folded.attr["f"].func.name].node_def}
    assert {"Sqrt", "Log1p", "StringToHashBucketFast"} <= body_ops
    assert not {"Sqrt", "Log1p", "StringToHashBucketFast"} & {n.op for n in graph_def.node}
    served = nodes[scope + "DataServiceDatasetV4"]
    assert scope + "RegisterDatasetV2" in served.input
    assert nodes[scope + "address"].attr["value"].tensor.string_val == [service.split("://")[1].encode()]
    assert [i for i in nodes["stage/put"].input[1:]] == [f"{scope}IteratorGetNext:{k}" for k in range(5)
                                                          ][:len(nodes["stage/put"].input) - 1]
    assert f"^{scope}MakeIterator" in nodes["MakeIterator"].input


def test_a_table_lookup_in_the_body_leaves_the_stage_alone_and_says_why(service):
    meta = input_graph(lookup=True)
    result, report = optimized(meta, service)
    assert not report.changed
    (line,) = report.summary
    assert "left as it was" in line and "LookupTableFindV2" in line and "table" in line
    assert not any("DataService" in n.op for n in result.graph_def.node)
    expected, _ = records(meta)
    seen, _ = records(result.meta_graph_def)
    assert seen == expected  # nothing changed: the same graph, bit for bit
