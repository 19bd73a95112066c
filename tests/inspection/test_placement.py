"""Placement on input tasks, read back from the optimized graph: the text, explain's sentence, JSON and HTML.

    range -> map -> batch -> iterator -> put ~~ take -> sqrt/abs/mul, hash -> loss(w, e)   (scale_out_graphs.py)
    optimized with input_job="input", input_tasks=2|3, central or sharded
"""

from __future__ import annotations

import json

import pytest

from smartstage.inspection.diff import GraphDiff
from smartstage.inspection.explain import explain
from smartstage.inspection.placement import placement_lines, stage_placements
from smartstage.inspection.render.html import html_report
from smartstage.inspection.render.json_report import json_report, read_json_report
from smartstage.inspection.render.text import text_report
from tests.inspection.scale_out_graphs import build_meta, optimized

T = "/job:input/replica:0/task:"
# The gradient's Reshape of the ids and its shape arithmetic stay on the trainer (cut_cost.py: recomputed there
# from StringToHashBucketFast:0, which crosses anyway).
BODY_OPS = "Abs x1, AddV2 x1, Mul x1, Sqrt x1, StringToHashBucketFast x1, Const x2"
SHARD_OPS = ("Abs x1, AddV2 x1, BatchDatasetV2 x1, IteratorGetNext x1, IteratorV2 x1, MakeIterator x1, "
             "... (+7 op types)")
FROM_TASKS = "  per batch tasks -> trainer: 2 tensor(s), 60 bytes: mul:0 float[3,3], StringToHashBucketFast:0 int64[3]"
TRAINER = "  trainer (the session's task): {head}; buffer, put, take: stage/buffer, stage/put, stage/take"

CENTRAL_2 = [
    "stage 'stage': central source on 2 task(s) of job 'input', 1 thread(s) per task, batch n's body on task n mod 2",
    TRAINER.format(head="head 2 node(s): IteratorV2, IteratorGetNext"),
    f"  {T}0 (lane 0): 7 node(s): {BODY_OPS}; e.g. Abs, add, Sqrt, mul",
    f"  {T}1 (lane 1): 7 node(s): {BODY_OPS}; e.g. stage/input_task_1/Abs, stage/input_task_1/add, "
    "stage/input_task_1/Sqrt, stage/input_task_1/mul",
    "  per batch trainer -> tasks: 2 tensor(s), 36 bytes + 1 of unknown size (strings or unknown dimensions): "
    "IteratorGetNext:1 float[3,3], IteratorGetNext:0 string[3]",
    FROM_TASKS,
]
SHARDED_3 = [
    "stage 'stage': sharded sources on 3 task(s) of job 'input', one reader per task, batches taken from the tasks "
    "in turn",
    TRAINER.format(head="no head"),
    f"  {T}0 (shard 0 of 3): 21 node(s): {SHARD_OPS}; e.g. RangeDataset, RangeDataset/input_shard, MapDataset, "
    "BatchDatasetV2",
    *[f"  {T}{i} (shard {i} of 3): 21 node(s): {SHARD_OPS}; e.g. stage/input_task_{i}/RangeDataset, "
      f"stage/input_task_{i}/RangeDataset/input_shard, stage/input_task_{i}/MapDataset, "
      f"stage/input_task_{i}/BatchDatasetV2" for i in (1, 2)],
    "  per batch trainer -> tasks: nothing",
    FROM_TASKS,
]


@pytest.fixture(scope="module")
def meta():
    return build_meta()


@pytest.mark.parametrize("mode, tasks, expected", [("central", 2, CENTRAL_2), ("sharded", 3, SHARDED_3)])
def test_the_placement_text_names_every_task_what_stays_on_the_trainer_and_what_crosses(meta, mode, tasks, expected):
    _, result = optimized(mode, tasks, meta)
    assert placement_lines(stage_placements(result.meta_graph_def)) == expected


@pytest.mark.parametrize("mode, tasks, node, sentence", [
    ("central", 2, "Sqrt", f"'Sqrt' runs on {T}0 (lane 0) for stage 'stage'; its copy on task 1: stage/input_task_1/Sqrt"),
    ("central", 3, "Sqrt", f"'Sqrt' runs on {T}0 (lane 0) for stage 'stage'; its copies on tasks 1, 2: "
                           "stage/input_task_1/Sqrt, stage/input_task_2/Sqrt"),
    ("central", 2, "IteratorGetNext", "'IteratorGetNext' stays on the trainer for stage 'stage': the head of the "
                                      "central source runs once per batch, in order, on the trainer"),
    ("sharded", 2, "IteratorGetNext", f"'IteratorGetNext' runs on {T}0 (shard 0 of 2) for stage 'stage'; its copy on "
                                      "task 1: stage/input_task_1/IteratorGetNext"),
    ("sharded", 3, "stage/buffer", "'stage/buffer' stays on the trainer: it is the buffer of stage 'stage' (never moved)"),
    ("central", 2, "loss", None),  # the main side: no input task involved
])
def test_explain_says_which_task_runs_a_node(meta, mode, tasks, node, sentence):
    _, result = optimized(mode, tasks, meta)
    explanation = explain(meta, node, result=result)
    assert explanation.placement == sentence
    assert ("  placement: " + sentence in explanation.text()) if sentence else "placement" not in explanation.text()
    assert explanation.to_dict()["placement"] == sentence


def test_threads_per_task_show_on_every_task(meta):
    import smartstage as ss

    result = ss.optimize(meta, ss.enable_smart_stage(), targets=["loss", "train_op"], input_job="input",
                         input_tasks=2, input_num_threads_per_task=2)
    (placement,) = stage_placements(result.meta_graph_def)
    assert placement.num_threads_per_task == 2 and [t.lanes for t in placement.tasks] == [(0, 2), (1, 3)]
    assert "2 thread(s) per task" in placement_lines((placement,))[0]
    assert placement_lines((placement,))[2].startswith(f"  {T}0 (lanes 0, 2): 7 node(s)")


def test_a_graph_without_input_tasks_has_no_placement_and_reports_none(meta):
    import smartstage as ss

    result = ss.optimize(meta, ss.enable_smart_stage(), targets=["loss", "train_op"])
    assert stage_placements(result.meta_graph_def) == () and stage_placements(meta) == ()
    diff = result.diff()
    assert diff.placement == () and "placement" not in diff.to_dict()
    assert "placement on input tasks" not in text_report(diff) and "Placement on input tasks" not in html_report(diff)


@pytest.mark.parametrize("mode, tasks", [("central", 2), ("sharded", 3)])
def test_diff_carries_the_placement_into_text_json_and_html(meta, mode, tasks):
    _, result = optimized(mode, tasks, meta)
    diff = result.diff()
    lines = placement_lines(diff.placement)
    text = text_report(diff)
    assert "placement on input tasks (1 stage(s)):\n" + "\n".join("  " + line for line in lines) in text
    document = json.loads(json_report(diff))
    (stage,) = document["placement"]
    assert (stage["stage"], stage["mode"], stage["job"], len(stage["tasks"])) == ("stage", mode, "input", tasks)
    assert stage["from_tasks_bytes"] == 60 and stage["tasks"][1]["task"] == f"{T}1"
    assert stage["to_tasks_bytes"] == (None if mode == "central" else 0)  # central: a string crosses; sharded: nothing
    assert read_json_report(json_report(diff)).placement == diff.placement
    assert GraphDiff.from_dict(document).to_dict() == document
    html = html_report(diff, result)
    assert "<h2 id=\"placement\">Placement on input tasks</h2>" in html
    assert all(f"<td>{T}{i}</td>" in html for i in range(tasks)) and f"<td>{T}{tasks}</td>" not in html
    assert "60 bytes" in html


@pytest.mark.parametrize("mode, shard_nodes", [("central", 0), ("sharded", 3)])  # sharded: 2 consts + ShardDataset
def test_two_stages_on_the_same_tasks_each_count_their_own_nodes_as_the_pass_placed_them(mode, shard_nodes):
    from tests.inspection.scale_out_graphs import build_two_stage_meta

    _, result = optimized(mode, 2, build_two_stage_meta())
    (report,) = [r for r in result.reports if r.name == "input_tasks"]
    placements = {p.stage: p for p in stage_placements(result.meta_graph_def)}
    assert sorted(placements) == ["stage_a", "stage_b"]
    for stage, plan in report.details.items():
        assert [t.nodes for t in placements[stage].tasks] == [len(plan.body) + shard_nodes] * 2
        assert set(plan.head) <= set(placements[stage].head)  # the view adds the iterator its read needs
    assert placements["stage_b"].tasks[0].examples[0] == ("StringToHashBucketFast" if mode == "central"
                                                          else "RangeDataset_1")


def test_verify_in_process_refuses_a_graph_whose_stage_runs_on_input_tasks(meta):
    from smartstage.errors import ConfigError
    from smartstage.inspection.verify_rewrite import verify_rewrite

    _, result = optimized("central", 2, meta)
    with pytest.raises(ConfigError, match="stage 'stage' runs on the tasks of job 'input'.*loopback cluster"):
        verify_rewrite(meta, 2, result=result, cluster=False)
