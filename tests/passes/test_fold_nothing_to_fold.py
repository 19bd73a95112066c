"""fold_dataset on a graph with no tf.data iterator read: it says so for every stage and does no per-stage analysis.

    before:  reader -> put ~~ take -> hash -> lookup(w) -> loss        (a queue stage, no IteratorGetNext)
    after:   the same; the fold's report: "stage: keeps its buffer and lanes: nothing to fold: ..."
"""

from __future__ import annotations

import tensorflow as tf

import smartstage as ss
from smartstage.passes import fold_dataset
from smartstage.passes.fold_dataset import NO_ITERATOR
from tests.passes.test_fold_dataset import fold_report, lookup_graph, optimized


def queue_graph():
    #   TextLineReader -> put ~~ take -> hash -> lookup(w) -> loss -> train      (staged(), a StageDef)
    graph = tf.Graph()
    with graph.as_default():
        files = tf.compat.v1.train.string_input_producer(["a.csv"], shuffle=False)
        _, lines = tf.compat.v1.TextLineReader().read_up_to(files, 4)
        lines = ss.staged(lines, capacity=2)
        ids = tf.strings.to_hash_bucket_fast(lines, 10)
        w = tf.compat.v1.get_variable("w", [10, 2])
        loss = tf.reduce_sum(tf.gather(w, ids), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def test_no_iterator_read_means_nothing_to_fold_and_no_per_stage_analysis(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the fold analysed a stage of a graph without an iterator read")

    monkeypatch.setattr(fold_dataset, "stage_sides", never)
    monkeypatch.setattr(fold_dataset, "fold_fit", never)
    result = optimized(queue_graph())
    report = fold_report(result)
    assert not report.changed
    (name,) = report.details
    assert report.details[name].skipped == NO_ITERATOR and not report.details[name].folds
    assert report.summary == (f"{name}: keeps its buffer and lanes: {NO_ITERATOR}",)
    assert NO_ITERATOR.startswith("nothing to fold: the graph has no tf.data iterator read (IteratorGetNext")
    assert ss.runtime.stage_defs_from_meta_graph(result.meta_graph_def)  # the stage keeps its StageDef


def test_a_graph_with_an_iterator_read_is_still_analysed():
    result = optimized(lookup_graph())
    assert fold_report(result).details["stage"].folds
