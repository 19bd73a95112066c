"""auto_stage: which input sources get a stage, what the inserted stage looks like, and why others keep their place.

Graphs are small tf.compat.v1 graphs (the source ops are real TensorFlow ops); nothing runs here
(tests/e2e/test_auto_stage.py runs them).
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from google.protobuf import text_format

import smartstage as ss
from smartstage.errors import NoStageError
from smartstage.inspection.explain import explain
from smartstage.graph.view import GraphView
from smartstage.passes import auto_stage
from smartstage.protos import StageDef
from smartstage.runtime import staged

# These tests check the inserted stage itself: lanes, not the fold into the dataset (tests/passes/test_fold_dataset.py).
AUTO = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), auto_stage=True, tf_data_stage="lanes")


def _dataset(n=8, batch=2):
    return tf.data.Dataset.range(n).batch(batch)


def _train(loss_input, name="w"):
    """loss = sum(cast(x) * w), minimized: a variable pins everything after the multiplication."""
    w = tf.compat.v1.get_variable(name, [], initializer=tf.ones_initializer())
    loss = tf.reduce_sum(tf.cast(loss_input, tf.float32) * w, name=f"loss_{name}")
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name=f"train_{name}")
    return loss, train_op


def _meta(graph, train_op=None):
    with graph.as_default():
        if train_op is not None:
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def _report(result) -> auto_stage.AutoStageReport:
    return result.extra["auto_stage"]


def _node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


def one_shot_graph():
    #   one_shot -> IteratorGetNext -> mul(2) -> cast -> mul(w) -> loss -> train
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next")
        _, train_op = _train(x * 2)
    return _meta(g, train_op)


def test_one_stage_at_the_iterator_then_expanded_like_any_stage():
    result = ss.optimize(one_shot_graph(), AUTO)
    (inserted,) = _report(result).inserted
    assert inserted.name == "smart_stage" and inserted.source.nodes == ("next",)
    assert not inserted.resettable  # a one-shot iterator has no initializer
    (p,) = result.partitions
    assert p.stage.origin == "auto" and p.changes_graph
    assert set(p.moved) == {"mul", "Cast"}  # the cast of x * 2 moves; the multiplication by w stays
    assert p.boundary_before == ("next:0",) and p.boundary_after == ("Cast:0",)
    g = result.graph_def
    assert _node(g, "smart_stage/put").input == ["smart_stage/buffer", "Cast"]
    assert "smart_stage/take" in _node(g, "mul_1").input
    assert GraphView(g).order() == [n.name for n in g.node]  # still in topological order


def test_the_stage_def_describes_the_inserted_stage_in_the_meta_graph():
    options = ss.AutoStageOptions(capacity=4, num_threads=2, num_clients=3, timeout_millis=1000,
                                  closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.DATA_LOSS),
                                  ignored_exception_types=(tf.errors.UNAVAILABLE,), name="prefetch")
    result = ss.optimize(one_shot_graph(), ss.enable_smart_stage(tf.compat.v1.ConfigProto(), auto_stage=options,
                                                                 tf_data_stage="lanes"))
    (sd,) = ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def)
    assert (sd.name, sd.origin, sd.capacity, sd.num_threads, sd.num_clients, sd.timeout_millis) == (
        "prefetch", "auto", 4, 2, 3, 1000)
    assert list(sd.closed_error_codes) == [tf.errors.OUT_OF_RANGE, tf.errors.DATA_LOSS]
    assert list(sd.ignored_error_codes) == [tf.errors.UNAVAILABLE]
    assert list(sd.source_nodes) == ["next"] and list(sd.boundary_tensors) == ["Cast:0"]
    assert (sd.put_node, sd.take_node, sd.buffer_node) == ("prefetch/put", "prefetch/take", "prefetch/buffer")
    assert _node(result.graph_def, "prefetch/buffer").attr["capacity"].i == 4


def test_inserted_nodes_are_the_ones_staged_builds():
    # The same source staged by hand with staged(name="stage") and by auto-stage with name="stage":
    # every node of the stage has the same op, inputs and attributes.
    by_hand = tf.Graph()
    with by_hand.as_default():
        x = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next")
        staged({"x": x})["x"]
    auto = tf.Graph()
    with auto.as_default():
        x = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next")
        tf.identity(x, name="y")
    result = ss.optimize(auto, ss.enable_smart_stage(tf.compat.v1.ConfigProto(), tf_data_stage="lanes",
                                                    auto_stage=ss.AutoStageOptions(name="stage")), targets=["y"])
    ignored = ("_output_shapes", "_has_manual_control_dependencies")
    hand_nodes = {n.name: n for n in by_hand.as_graph_def().node if n.name.startswith("stage/")}
    auto_nodes = {n.name: n for n in result.graph_def.node if n.name.startswith("stage/")}
    assert set(auto_nodes) == set(hand_nodes)
    for name, hand in hand_nodes.items():
        got = auto_nodes[name]
        assert (got.op, list(got.input), got.device) == (hand.op, list(hand.input), hand.device), name
        want = {k: text_format.MessageToString(v) for k, v in hand.attr.items() if k not in ignored}
        have = {k: text_format.MessageToString(v) for k, v in got.attr.items() if k not in ignored}
        assert have == want, name


def test_an_initializable_iterator_gets_the_reinitialisation_guard():
    #   IteratorV2 -> MakeIterator (initializer)  ->  MakeIterator also runs ^smart_stage/stale_mark
    #             \-> IteratorGetNext -> ...     ->  take waits on ^ready_check and ^fresh_check
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_initializable_iterator(_dataset())
        _, train_op = _train(it.get_next(name="next") + 1)
    result = ss.optimize(_meta(g, train_op), AUTO)
    (inserted,) = _report(result).inserted
    assert inserted.resettable and inserted.source.initializers == ("MakeIterator",)
    (sd,) = ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def)
    assert list(sd.reset_trigger_nodes) == ["MakeIterator"]
    assert (sd.stale_mark_node, sd.reset_node) == ("smart_stage/stale_mark", "smart_stage/reset")
    gd = result.graph_def
    assert "^smart_stage/stale_mark" in _node(gd, "MakeIterator").input
    assert set(_node(gd, "smart_stage/take").input) >= {"^smart_stage/ready_check", "^smart_stage/fresh_check"}
    assert _node(gd, "smart_stage/reset_buffer").input == ["smart_stage/buffer"]
    assert GraphView(gd).order() == [n.name for n in gd.node]


def test_two_input_pipelines_joined_in_the_model_get_one_stage_each():
    #   iterator a -> next_a --\
    #                           concat -> loss(w)
    #   iterator b -> next_b --/
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next_a")
        b = tf.compat.v1.data.make_one_shot_iterator(_dataset().map(lambda v: v * 10)).get_next(name="next_b")
        _, train_op = _train(tf.concat([a + 1, b - 1], axis=0))
    result = ss.optimize(_meta(g, train_op), AUTO)
    assert [(s.name, s.source.nodes) for s in _report(result).inserted] == [
        ("smart_stage", ("next_a",)), ("smart_stage_1", ("next_b",))]
    moved = {p.stage.name: set(p.moved) for p in result.partitions}
    assert moved["smart_stage"] == {"add"} and moved["smart_stage_1"] == {"sub"}
    # The concat reads both stages, so it stays: each take carries its own branch.
    assert {p.stage.name: p.boundary_after for p in result.partitions} == {
        "smart_stage": ("add:0",), "smart_stage_1": ("sub:0",)}


def test_two_reads_of_one_iterator_are_one_source_and_one_stage():
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_one_shot_iterator(_dataset())
        _, train_op = _train(it.get_next(name="first") - it.get_next(name="second"))
    result = ss.optimize(_meta(g, train_op), AUTO)
    (inserted,) = _report(result).inserted
    assert inserted.source.nodes == ("first", "second")
    assert inserted.carried == ("first:0", "second:0")


def test_queue_batch_dequeue_is_a_source_and_the_reader_behind_it_is_not():
    #   filenames -> reader.read -> train.batch enqueue (QueueRunner) ~~ batch dequeue -> decode -> loss
    g = tf.Graph()
    with g.as_default():
        files = tf.compat.v1.train.string_input_producer(["unused.csv"], shuffle=False)
        _, line = tf.compat.v1.TextLineReader().read(files, name="read")
        batch = tf.compat.v1.train.batch([line], batch_size=2, name="batch")
        (value,) = tf.io.decode_csv(batch, [[0]], name="decode")
        _, train_op = _train(value)
    for targets in (None, ["train_w"]):  # a bare GraphDef knows no targets
        result = ss.optimize(g.as_graph_def() if targets is None else _meta(g), AUTO, targets=targets)
        report = _report(result)
        (inserted,) = report.inserted
        assert inserted.source.nodes == ("batch",) and inserted.source.kind == "queue"
        kept = {v.source.nodes: v.kind for v in report.kept}
        assert kept == {("read",): auto_stage.FEEDS_QUEUE if targets is None else auto_stage.NOT_READ}
        assert "decode" in result.partitions[0].moved


def eval_iterator_graph(fetch_eval_batch: bool):
    """A train iterator read by the step and an eval iterator read by an eval loss (or fetched directly)."""
    g = tf.Graph()
    with g.as_default():
        train_next = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="train_next")
        eval_it = tf.compat.v1.data.make_initializable_iterator(_dataset(4))
        eval_next = eval_it.get_next(name="eval_next")
        _, train_op = _train(train_next * 2)
        eval_loss = tf.reduce_sum(eval_next * 3, name="eval_loss")
    return _meta(g, train_op), ["eval_next" if fetch_eval_batch else "eval_loss"]


def test_an_eval_iterator_is_staged_when_its_fetches_are_targets():
    meta, eval_targets = eval_iterator_graph(fetch_eval_batch=False)
    result = ss.optimize(meta, AUTO, targets=eval_targets)
    assert [s.source.nodes for s in _report(result).inserted] == [("train_next",), ("eval_next",)]
    # Without the eval fetches as targets the step does not read it: it stays, with the reason.
    result = ss.optimize(meta, AUTO)
    report = _report(result)
    assert [s.source.nodes for s in report.inserted] == [("train_next",)]
    (kept,) = report.kept
    assert kept.kind == auto_stage.NOT_READ and "eval_next" in kept.describe()
    assert any("eval_next" in note and "stays synchronous" in note for note in result.notes)


def test_an_iterator_fetched_directly_stays_synchronous():
    meta, eval_targets = eval_iterator_graph(fetch_eval_batch=True)
    result = ss.optimize(meta, AUTO, targets=eval_targets)
    report = _report(result)
    assert [s.source.nodes for s in report.inserted] == [("train_next",)]
    (kept,) = report.kept
    assert kept.kind == auto_stage.FETCHED and "fetched directly" in kept.reason


@pytest.mark.parametrize("control_flow_v2, reason", [(False, "behind control flow"), (True, "inside function")])
def test_a_source_behind_control_flow_stays_synchronous(control_flow_v2, reason):
    #   v1: pred -> Switch -> (pivot) ^-> IteratorGetNext -> Merge -> loss
    #   v2: If(pred) calls a branch function holding the IteratorGetNext
    if not control_flow_v2:
        tf.compat.v1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            it = tf.compat.v1.data.make_one_shot_iterator(_dataset())
            use = tf.compat.v1.placeholder_with_default(True, [], name="use")
            x = tf.compat.v1.cond(use, lambda: it.get_next(name="next"), lambda: tf.constant([0, 0], tf.int64))
            _, train_op = _train(x)
    finally:
        tf.compat.v1.enable_control_flow_v2()
    with pytest.raises(NoStageError, match=reason):
        ss.optimize(_meta(g, train_op), AUTO)


def test_a_feedable_iterator_stays_synchronous():
    g = tf.Graph()
    with g.as_default():
        handle = tf.compat.v1.placeholder(tf.string, [], name="handle")
        it = tf.compat.v1.data.Iterator.from_string_handle(handle, tf.compat.v1.data.get_output_types(_dataset()))
        _, train_op = _train(it.get_next(name="next"))
    with pytest.raises(NoStageError, match="fed 'handle'"):
        ss.optimize(_meta(g, train_op), AUTO)


def test_a_graph_with_a_stage_keeps_it_and_only_uncovered_sources_get_one():
    #   next_a -> staged -> ...       (covered: upstream of the hand-placed put)
    #   next_b -> ...                 (a stage is inserted)
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next_a")
        b = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next_b")
        a = staged(a + 1)
        _, train_op = _train(a * b)
    result = ss.optimize(_meta(g, train_op), AUTO)
    report = _report(result)
    assert [s.source.nodes for s in report.inserted] == [("next_b",)]
    (covered,) = report.kept
    assert (covered.kind, covered.stage) == (auto_stage.COVERED, "stage")
    assert sorted((p.stage.name, p.stage.origin) for p in result.partitions) == [
        ("smart_stage", "auto"), ("stage", "staged")]


def test_no_source_and_no_stage_is_a_clear_error():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        tf.identity(x * 2, name="y")
    with pytest.raises(NoStageError, match="auto-stage found no input source"):
        ss.optimize(g, AUTO, targets=["y"])


def test_running_the_pipeline_twice_gives_the_same_graph():
    once = ss.optimize(one_shot_graph(), AUTO)
    twice = ss.optimize(once.meta_graph_def, AUTO)
    assert not _report(twice).inserted
    assert _report(twice).kept[0].kind == auto_stage.COVERED
    assert twice.graph_def == once.graph_def


def test_a_taken_scope_name_is_made_unique_and_the_device_follows_the_source():
    g = tf.Graph()
    with g.as_default():
        tf.constant(0, name="smart_stage/other")  # the scope is taken
        with tf.device("/device:CPU:0"):
            x = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next(name="next")
        _, train_op = _train(x)
    result = ss.optimize(_meta(g, train_op), AUTO)
    (inserted,) = _report(result).inserted
    assert inserted.name == "smart_stage_1"
    devices = {n.device for n in result.graph_def.node if n.name.startswith("smart_stage_1/")}
    assert devices == {"/device:CPU:0"}


def test_both_config_spellings_give_the_same_stage():
    from smartstage.compat import tf as deeprec_tf

    options = ss.AutoStageOptions(capacity=3, num_threads=2, name="prefetch")
    stock = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), auto_stage=options)
    deeprec = deeprec_tf.ConfigProto()
    deeprec.graph_options.optimizer_options.do_smart_stage = True
    deeprec.graph_options.optimizer_options.smart_stage_options.CopyFrom(
        deeprec_tf.SmartStageOptions(capacity=3, num_threads=2, name="prefetch"))
    assert ss.options_from_config(stock).auto_stage == ss.options_from_config(deeprec).auto_stage
    a, b = (ss.optimize(one_shot_graph(), config) for config in (stock, deeprec))
    assert a.graph_def == b.graph_def
    # do_smart_stage alone keeps DeepRec's first mode: a graph without a stage is an error.
    plain = deeprec_tf.ConfigProto()
    plain.graph_options.optimizer_options.do_smart_stage = True
    with pytest.raises(NoStageError):
        ss.optimize(one_shot_graph(), plain)



def test_the_defaults_are_autotune_in_both_config_spellings():
    from smartstage.compat import tf as deeprec_tf

    # enable_smart_stage(ss.ConfigProto(), auto_stage=AutoStageOptions()) refused capacity=-1 (AUTOTUNE).
    deeprec = ss.enable_smart_stage(deeprec_tf.ConfigProto(), auto_stage=ss.AutoStageOptions())
    stock = ss.enable_smart_stage(tf.compat.v1.ConfigProto(), auto_stage=ss.AutoStageOptions())
    auto = ss.options_from_config(deeprec).auto_stage
    assert auto == ss.options_from_config(stock).auto_stage
    assert (auto.capacity, auto.num_threads, auto.stage_subgraph_thread_pool_id) == (ss.AUTOTUNE,) * 3
    # DeepRec's SmartStageOptions(): what is not given is AUTOTUNE; what is given is kept.
    assert deeprec_tf.SmartStageOptions().capacity == ss.AUTOTUNE
    assert deeprec_tf.SmartStageOptions().num_threads == ss.AUTOTUNE
    given = deeprec_tf.SmartStageOptions(capacity=1, num_threads=1)
    assert (given.capacity, given.num_threads) == (1, 1)
    with pytest.raises(ss.ConfigError, match=r"capacity=0; pass an integer >= 1 or ss.AUTOTUNE"):
        deeprec_tf.SmartStageOptions(capacity=0)
    with pytest.raises(ss.ConfigError, match=r"num_clients=-1; pass an integer >= 1$"):
        deeprec_tf.SmartStageOptions(num_clients=-1)

def test_the_diff_and_explain_treat_the_inserted_stage_like_a_hand_placed_one():
    meta = one_shot_graph()
    result = ss.optimize(meta, AUTO)
    diff = result.diff()
    assert {m.name for m in diff.moved_in("smart_stage")} >= {"mul", "Cast"}
    assert {"smart_stage/put", "smart_stage/take"} <= {n.name for n in diff.added}
    why = explain(meta, "mul_1", config=AUTO)
    assert why.verdict == "pinned" and why.stage == "smart_stage" and why.cause == "w"
    assert explain(meta, "Cast", config=AUTO).verdict == "moved"


def test_stage_def_names_follow_import_scopes():
    result = ss.optimize(eval_iterator_graph(False)[0], AUTO, targets=["eval_loss"])
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.train.import_meta_graph(result.meta_graph_def, import_scope="tower")
    defs = {d.name: d for d in ss.stage_defs(g)}
    sd = defs["tower/smart_stage_1"]
    assert isinstance(sd, StageDef)
    assert list(sd.reset_trigger_nodes) == ["tower/MakeIterator"]
    assert (sd.stale_mark_node, sd.reset_node) == ("tower/smart_stage_1/stale_mark", "tower/smart_stage_1/reset")
    assert list(sd.source_nodes) == ["tower/eval_next"]


def test_the_cli_takes_auto_stage_for_optimize_explain_and_verify(tmp_path, capsys):
    from smartstage.cli.main import main
    from smartstage.graph.load import load_graph, stage_defs_of

    src, out = tmp_path / "in.meta", tmp_path / "out.meta"
    src.write_bytes(one_shot_graph().SerializeToString())
    assert main(["optimize", str(src), "-o", str(out), "--auto-stage"]) == 0
    # The inserted stage reads a tf.data iterator: it folds into the dataset (fold_dataset), no StageDef is left.
    assert stage_defs_of(load_graph(str(out)).meta_graph_def) == []
    assert main(["explain", str(src), "Cast", "--auto-stage"]) == 0
    assert "moved to the prefetch side of stage 'smart_stage'" in capsys.readouterr().out
    assert main(["verify", str(src), "--steps", "3", "--auto-stage"]) == 0
    assert "identical" in capsys.readouterr().out


def test_gpu_placement_moves_the_buffer_with_the_op_that_empties_it():
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_initializable_iterator(_dataset())
        x = it.get_next(name="next")
        with tf.device("/device:GPU:0"):
            _, train_op = _train(x * 2)
    result = ss.optimize(_meta(g, train_op), ss.enable_smart_stage(do_smart_stage_gpu=True, auto_stage=True))
    devices = {n.name: n.device for n in result.graph_def.node}
    assert devices["smart_stage/buffer"] == devices["smart_stage/reset_buffer"] == "/device:GPU:0"
    assert devices["smart_stage/take"] == devices["smart_stage/put"] == "/device:GPU:0"


def test_a_hand_placed_stage_at_an_initializable_iterator_is_reported_as_not_emptied_on_reinit():
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_initializable_iterator(_dataset())
        _, train_op = _train(staged(it.get_next(name="next")) * 2)
    (covered,) = _report(ss.optimize(_meta(g, train_op), AUTO)).kept
    assert covered.kind == auto_stage.COVERED and "does not empty that stage" in covered.reason
