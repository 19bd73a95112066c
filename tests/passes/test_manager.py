"""The pass manager on tiny fake passes: declared order checked, verification only after a change, failures
named with the passes before them, the verifier's view kept for the next pass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from smartstage.config.options import SmartStageOptions
from smartstage.errors import PassError, VerificationError
from smartstage.passes.manager import PassContext, PassResult, PassManager
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
        PassManager([Fake("a", provides=("stages",)), Fake("b", requires=("partitions",))])


def test_the_declared_order_is_accepted_and_given_fields_need_no_provider():
    manager = PassManager([Fake("a", requires=("targets", "feeds"), provides=("stages",)),
                         Fake("b", requires=("stages",))])
    assert manager.names == ["a", "b"]


def test_reports_say_changed_both_ways_and_the_graph_flows_from_pass_to_pass():
    graph, reports = PassManager([Fake("keep"), Fake("add", edit=add_node)]).run(small(), ctx())
    assert [(r.name, r.changed) for r in reports] == [("keep", False), ("add", True)]
    assert [n.name for n in graph.node] == ["x", "y", "z"]
    assert reports[1].summary == ("add: edited",)


def test_a_changed_graph_is_verified_and_a_broken_one_names_the_pass_and_those_before():
    with pytest.raises(VerificationError, match=r"missing.*\[in pass 'break' \(after keep\)\]"):
        PassManager([Fake("keep"), Fake("break", edit=dangling)]).run(small(), ctx())


def test_an_unchanged_graph_is_not_verified():
    # A pass that says it changed nothing is trusted not to have: its (broken) input is not re-checked.
    broken = dangling(small())
    graph, _ = PassManager([Fake("keep")]).run(broken, ctx())
    assert graph is broken


def test_a_bug_in_a_pass_becomes_a_pass_error_with_the_cause_kept():
    with pytest.raises(PassError, match=r"pass 'boom' failed after \[keep\]: ZeroDivisionError: x") as info:
        PassManager([Fake("keep"), Fake("boom", error=ZeroDivisionError("x"))]).run(small(), ctx())
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_the_verifiers_view_is_kept_for_the_next_pass():
    seen = []

    class Look(Fake):
        def run(self, graph_def, c):
            seen.append(c.view_of(graph_def))
            return PassResult(graph_def, changed=False)

    c = ctx()
    PassManager([Fake("add", edit=add_node), Look("look")]).run(small(), c)
    assert seen[0] is c.view_of(seen[0].graph_def)
    assert "z" in seen[0]


# -- the contract, checked after each pass ---------------------------------------------------------


def copy_unchanged(graph_def):
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    return new


class SaysUnchanged(Fake):
    """Returns a copy while reporting no change: the identity check must catch it."""

    def run(self, graph_def, c):
        return PassResult(copy_unchanged(graph_def), changed=False)


class EditsInPlace(Fake):
    def run(self, graph_def, c):
        graph_def.node[0].device = "/cpu:0"
        return PassResult(graph_def, changed=True)


class Provides(Fake):
    def run(self, graph_def, c):
        c.stages = []
        return PassResult(graph_def, changed=False)


@dataclass
class EditsStageDef(Fake):
    updates: tuple = ()

    def run(self, graph_def, c):
        c.stage_defs[0].capacity = 7
        return PassResult(graph_def, changed=False)


def test_a_pass_reporting_no_change_must_return_the_graph_it_was_given():
    with pytest.raises(PassError, match=r"pass 'copy' broke its contract: it reports no change but returned a "
                                        r"different GraphDef"):
        PassManager([Fake("keep"), SaysUnchanged("copy")]).run(small(), ctx())


def test_a_pass_reporting_a_change_must_not_return_its_edited_input():
    with pytest.raises(PassError, match=r"pass 'inplace' broke its contract: it reports a change but returned the "
                                        r"GraphDef it was given"):
        PassManager([EditsInPlace("inplace")]).run(small(), ctx())


def test_what_a_pass_provides_must_be_set_after_it_runs():
    with pytest.raises(PassError, match=r"pass 'a' broke its contract: it declares it provides stages but did not "
                                        r"set it"):
        PassManager([Fake("a", provides=("stages",))]).run(small(), ctx())
    graph, reports = PassManager([Provides("b", provides=("stages",))]).run(small(), ctx())
    assert [r.name for r in reports] == ["b"]


def test_a_stage_def_changes_only_in_a_pass_that_declares_it():
    from smartstage.protos import StageDef

    c = ctx()
    c.stage_defs = [StageDef(name="stage", capacity=2)]
    with pytest.raises(PassError, match=r"pass 'sd' broke its contract: it edited a StageDef without declaring it"):
        PassManager([EditsStageDef("sd")]).run(small(), c)
    c.stage_defs = [StageDef(name="stage", capacity=2)]
    PassManager([EditsStageDef("sd", updates=("stage_defs",))]).run(small(), c)
    assert c.stage_defs[0].capacity == 7


def test_a_pass_must_declare_its_contract_with_fields_the_context_has():
    class Bare:
        name = "bare"

        def run(self, graph_def, c):
            return PassResult(graph_def, changed=False)

    with pytest.raises(PassError, match=r"pass 'bare' does not declare 'requires'"):
        PassManager([Bare()])
    with pytest.raises(PassError, match=r"pass 'typo' declares stagez, which PassContext has no field for"):
        PassManager([Fake("typo", provides=("stagez",))])
    with pytest.raises(PassError, match=r"pass 'u' declares it updates stages in place; only stage_defs"):
        PassManager([EditsStageDef("u", updates=("stages",))])


def test_every_pass_of_every_flag_combination_declares_a_valid_contract():
    from smartstage.config.options import AutoStageOptions
    from smartstage.passes import passes_for

    everything = dict(do_smart_stage=True, do_smart_stage_gpu=True, stage_multi_stream=True,
                      auto_stage=AutoStageOptions())
    with_tasks = SmartStageOptions(**everything, input_job="input", input_tasks=2)
    with_service = SmartStageOptions(**everything, input_mode="tf_data_service", tf_data_service="grpc://localhost:1")
    assert PassManager(passes_for(with_tasks)).names == [
        "find_stages", "auto_stage", "partition", "expand_stage", "gpu_placement", "multi_stream", "input_tasks"]
    assert PassManager(passes_for(with_service)).names[-1] == "tfdata_service"
