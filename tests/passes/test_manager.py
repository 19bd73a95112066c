"""The pass manager on tiny fake passes: declared order checked, verification only after a change, failures
named with the passes before them, the verifier's view kept for the next pass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from smartstage.config.options import SmartStageOptions
from smartstage.errors import PassError, VerificationError
from smartstage.passes.manager import PassContext, PassResult, Pipeline
from tests.builder import G, N


@dataclass
class Fake:
    name: str
    requires: tuple = ()
    provides: tuple = ()
    edit: object = None  # graph_def -> new graph_def, or None: no change
    error: Exception | None = None

    def run(self, graph_def, ctx):
        if self.error is not None:
            raise self.error
        if self.edit is None:
            return PassResult(graph_def, changed=False, summary=(f"{self.name}: nothing",))
        return PassResult(self.edit(graph_def), changed=True, summary=(f"{self.name}: edited",))


def small():
    #   x -> y
    return G(N("x", "Const", dtype=tf.float32, value=1.0), N("y", "Identity", ["x"], T=tf.float32))


def add_node(graph_def):
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    new.node.add().CopyFrom(N("z", "Identity", ["y"], T=tf.float32))
    return new


def dangling(graph_def):
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    new.node.add().CopyFrom(N("bad", "Identity", ["missing"], T=tf.float32))
    return new


def ctx():
    return PassContext(options=SmartStageOptions(do_smart_stage=True))


def test_a_pass_that_requires_what_no_earlier_pass_provides_is_refused_when_the_pipeline_is_built():
    with pytest.raises(PassError, match=r"pass 'b' requires partitions, which no earlier pass provides \(passes before it: \['a'\]\)"):
        Pipeline([Fake("a", provides=("stages",)), Fake("b", requires=("partitions",))])


def test_the_declared_order_is_accepted_and_given_fields_need_no_provider():
    Pipeline([Fake("a", requires=("targets", "feeds"), provides=("stages",)), Fake("b", requires=("stages",))])


def test_reports_say_changed_both_ways_and_the_graph_flows_from_pass_to_pass():
    graph, reports = Pipeline([Fake("keep"), Fake("add", edit=add_node)]).run(small(), ctx())
    assert [(r.name, r.changed) for r in reports] == [("keep", False), ("add", True)]
    assert [n.name for n in graph.node] == ["x", "y", "z"]
    assert reports[1].summary == ("add: edited",)


def test_a_changed_graph_is_verified_and_a_broken_one_names_the_pass_and_those_before():
    with pytest.raises(VerificationError, match=r"missing.*\[in pass 'break' \(after keep\)\]"):
        Pipeline([Fake("keep"), Fake("break", edit=dangling)]).run(small(), ctx())


def test_an_unchanged_graph_is_not_verified():
    # A pass that says it changed nothing is trusted not to have: its (broken) input is not re-checked.
    broken = dangling(small())
    graph, _ = Pipeline([Fake("keep")]).run(broken, ctx())
    assert graph is broken


def test_a_bug_in_a_pass_becomes_a_pass_error_with_the_cause_kept():
    with pytest.raises(PassError, match=r"pass 'boom' failed after \[keep\]: ZeroDivisionError: x") as info:
        Pipeline([Fake("keep"), Fake("boom", error=ZeroDivisionError("x"))]).run(small(), ctx())
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_the_verifiers_view_is_kept_for_the_next_pass():
    seen = []

    class Look(Fake):
        def run(self, graph_def, c):
            seen.append(c.view_of(graph_def))
            return PassResult(graph_def, changed=False)

    c = ctx()
    Pipeline([Fake("add", edit=add_node), Look("look")]).run(small(), c)
    assert seen[0] is c.view_of(seen[0].graph_def)
    assert "z" in seen[0]
