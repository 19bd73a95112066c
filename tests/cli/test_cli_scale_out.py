"""The `smartstage` command on a graph placed on input tasks: explain --placement, diff, the report, and
verify on a loopback cluster (a trainer and 2 input-task servers, subprocesses on 127.0.0.1).

    range -> map -> batch -> iterator -> put ~~ take -> sqrt/abs/mul, hash -> loss(w, e)   (scale_out_graphs.py)
"""

from __future__ import annotations

import json
import subprocess

import pytest

from smartstage.cli.main import main
from smartstage.graph.load import write_graph
from smartstage.inspection import loopback
from tests.inspection.scale_out_graphs import build_meta
from tests.inspection.test_placement import CENTRAL_2, SHARDED_3

SCALE_OUT = ("--input-job", "input", "--input-tasks")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale_out") / "model.meta"
    write_graph(build_meta(), path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("tasks, mode, expected", [("2", "central", CENTRAL_2), ("3", "sharded", SHARDED_3)])
def test_explain_placement_prints_each_stage_and_task(model, capsys, tasks, mode, expected):
    code, out, err = run(capsys, "explain", model, "--placement", *SCALE_OUT, tasks, "--input-mode", mode)
    assert code == 0, err
    assert out == "\n".join(expected) + "\n"


def test_explain_a_node_adds_the_task_that_runs_it_and_json_has_both(model, capsys):
    code, out, err = run(capsys, "explain", model, "Sqrt", *SCALE_OUT, "2")
    assert code == 0, err
    assert out.splitlines()[-1] == ("  placement: 'Sqrt' runs on /job:input/replica:0/task:0 (lane 0) for stage "
                                    "'stage'; its copy on task 1: stage/input_task_1/Sqrt")
    code, out, err = run(capsys, "explain", model, "Sqrt", "--placement", "--json", *SCALE_OUT, "2")
    document = json.loads(out)
    assert document["placement"].startswith("'Sqrt' runs on /job:input/replica:0/task:0")
    assert [t["task"] for t in document["placements"][0]["tasks"]] == [f"/job:input/replica:0/task:{i}" for i in (0, 1)]


def test_explain_placement_of_an_optimized_graph_needs_no_flags_and_an_unplaced_one_says_so(model, tmp_path, capsys):
    fast = tmp_path / "fast.meta"
    assert run(capsys, "optimize", model, "-o", fast, *SCALE_OUT, "2", "--target", "loss")[0] == 0
    code, out, _ = run(capsys, "explain", fast, "--placement", "--target", "loss")
    assert code == 0 and out == "\n".join(CENTRAL_2) + "\n"
    code, out, _ = run(capsys, "explain", model, "--placement")
    assert code == 0 and out.startswith(f"no stage of {model} is placed on input tasks (optimize it with --input-job")
    code, _, err = run(capsys, "explain", model)
    assert code == 2 and "explain needs NODE" in err


def test_diff_and_the_reports_show_the_placement(model, tmp_path, capsys):
    fast, report, html = tmp_path / "fast.meta", tmp_path / "report.json", tmp_path / "report.html"
    code, _, err = run(capsys, "optimize", model, "-o", fast, *SCALE_OUT, "3", "--input-mode", "sharded",
                       "--report", report, "--html", html)
    assert code == 0, err
    (stage,) = json.loads(report.read_text())["placement"]
    assert stage["mode"] == "sharded" and [t["nodes"] for t in stage["tasks"]] == [21, 21, 21]
    assert "Placement on input tasks" in html.read_text()
    code, out, _ = run(capsys, "diff", model, fast)
    assert code == 0 and "\n".join("  " + line for line in SHARDED_3) in out


@pytest.mark.cluster
def test_verify_runs_both_graphs_on_a_loopback_cluster_and_leaves_no_server(model, capsys, monkeypatch):
    started = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(loopback.subprocess, "Popen", recording_popen)
    code, out, err = run(capsys, "verify", model, "--steps", "5", *SCALE_OUT, "2")
    assert code == 0, err
    assert out == ("verify: identical: 4 step(s), 2 fetch(es) each, then 2 variable(s) (the input ended) on a "
                   "loopback cluster (a trainer and 2 input task(s) of job input); fetched train_op, loss:0\n")
    assert len(started) == 3 and all(p.poll() is not None for p in started)
    # sharded sources form other batches by design: verify says they differ, and why
    code, out, err = run(capsys, "verify", model, "--steps", "5", *SCALE_OUT, "2", "--input-mode", "sharded")
    assert code == 1, err
    assert out.startswith("verify: NOT identical: step 0: loss:0 differs") and "by design" in out
    assert len(started) == 6 and all(p.poll() is not None for p in started)


@pytest.mark.cluster
def test_verify_names_the_server_that_did_not_start_and_kills_the_others(model, capsys, monkeypatch):
    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(loopback.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    monkeypatch.setattr(loopback, "READY", "a line no server prints")  # as if no server ever came up
    code, _, err = run(capsys, "verify", model, "--steps", "2", *SCALE_OUT, "2", "--start-timeout", "1")
    assert code == 2
    assert err.startswith("smartstage: error: loopback cluster: server /job:trainer/task:0 (127.0.0.1:")
    assert "did not start within 1 s" in err and len(err.strip().splitlines()) == 1
    assert len(started) == 3 and all(p.poll() is not None for p in started)


@pytest.mark.cluster
def test_a_taken_port_is_named(monkeypatch):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    real = loopback.free_ports
    monkeypatch.setattr(loopback, "free_ports", lambda n: [taken.getsockname()[1]] + real(n - 1))
    try:
        with pytest.raises(loopback.LoopbackClusterError, match=r"server /job:trainer/task:0 .* exited before it "
                                                                 r"started .*its port is unavailable"):
            loopback.LoopbackCluster("input", 1).start()
    finally:
        taken.close()


def test_optimize_with_tfdata_service_folds_the_body_into_the_service_pipeline(tmp_path, capsys):
    """--tf-data-service ADDRESS is input_mode='tf_data_service' (tests/passes/test_tfdata_service.py: the pass);
    --tfdata-service, its old spelling, works and warns."""
    from tests.passes.test_tfdata_service import sqrt_graph
    from smartstage.graph.load import load_graph

    meta, targets = sqrt_graph()
    src, fast = tmp_path / "model.meta", tmp_path / "fast.meta"
    write_graph(meta, src)
    target_flags = [flag for name in targets for flag in ("--target", name)]
    code, out, err = run(capsys, "optimize", src, "-o", fast, "--tf-data-service", "grpc://localhost:5050",
                         *target_flags)
    assert code == 0, err
    ops = {node.op for node in load_graph(str(fast)).graph_def.node}
    assert {"DataServiceDatasetV4", "RegisterDatasetV2"} <= ops and "Sqrt" not in ops
    with pytest.warns(FutureWarning, match="--tfdata-service is deprecated .* use --tf-data-service"):
        code, out, err = run(capsys, "optimize", src, "-o", tmp_path / "bad.meta", "--tfdata-service", "http://x/y")
    assert code == 2 and "tf_data_service" in err and not (tmp_path / "bad.meta").exists()
