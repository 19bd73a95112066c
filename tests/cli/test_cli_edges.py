"""The command line at its edges: all outputs or none, file modes, causes of failed runs, bad ports, no stage."""

from __future__ import annotations

import logging
import os
import stat
import threading

import numpy as np
import pytest
import tensorflow as tf

from smartstage.cli.main import main
from smartstage.graph.load import write_graph
from tests.inspection.graphs import no_stage_graph, tiny_graph


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smartstage: error: "), err
    return lines[0]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "in" / "tiny.pb"
    write_graph(tiny_graph(), path)
    return path


def queue_stage_meta(path, unfed: bool = False):
    """A hand-made FIFOQueue stage filled by a QueueRunner, written to `path` (.meta).

        dataset -> q_put ~~ q_take -> square -> loss(w) [+ needs_feed] -> train_op
    """
    graph = tf.Graph()
    with graph.as_default():
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(np.arange(400, dtype=np.float32)).batch(2)).get_next()
        queue = tf.queue.FIFOQueue(2, [tf.float32], name="q")
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [queue.enqueue([batch], name="q_put")]))
        x = queue.dequeue(name="q_take")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum((tf.square(x) + 1.0) * w, name="loss")
        if unfed:
            loss = tf.add(loss, tf.compat.v1.placeholder(tf.float32, [], name="needs_feed"), name="loss_fed")
        tf.compat.v1.add_to_collection("losses", loss)
        tf.compat.v1.add_to_collection("train_op", tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss))
        tf.compat.v1.train.export_meta_graph(str(path), graph=graph)
    return path


# -- 2. all outputs of one command, or none -----------------------------------------------------------
def test_a_failed_report_leaves_no_graph_behind(tiny, tmp_path, capsys):
    out, report = tmp_path / "out.pb", tmp_path / "report.html"
    report.mkdir()  # the report cannot be written: its path is a folder
    code, _, err = run(capsys, "optimize", tiny, "-o", out, "--html", report, "--report", tmp_path / "r.json")
    assert code == 2
    assert "report.html" in one_line_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "report.html"]  # no OUT, no JSON, no temp file
    assert list(report.iterdir()) == []


def test_a_failed_command_keeps_the_previous_outputs(tiny, tmp_path, capsys):
    out, json_path = tmp_path / "out.pb", tmp_path / "r.json"
    assert run(capsys, "optimize", tiny, "-o", out, "--report", json_path)[0] == 0
    before = out.read_bytes(), json_path.read_bytes()
    (tmp_path / "tb").write_text("a file where a folder is needed")
    code, _, err = run(capsys, "optimize", tiny, "-o", out, "--report", json_path, "--tensorboard", tmp_path / "tb")
    assert code == 2 and "tb" in one_line_error(err)
    assert (out.read_bytes(), json_path.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.pb", "r.json", "tb"]


def test_all_outputs_are_written_together(tiny, tmp_path, capsys):
    out = tmp_path / "out.pb"
    code, _, err = run(capsys, "optimize", tiny, "-o", out, "--html", tmp_path / "r.html", "--report",
                       tmp_path / "r.json", "--tensorboard", tmp_path / "tb")
    assert code == 0, err
    assert {p.name for p in tmp_path.iterdir()} == {"in", "out.pb", "r.html", "r.json", "tb"}
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["after", "before"]


# -- 6. files -----------------------------------------------------------------------------------------
def test_outputs_get_the_mode_of_the_umask(tiny, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        code, _, err = run(capsys, "optimize", tiny, "-o", tmp_path / "out.pb", "--report", tmp_path / "r.json")
    finally:
        os.umask(old)
    assert code == 0, err
    for name in ("out.pb", "r.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_a_write_failure_names_the_users_path(tiny, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root)")
        code, _, err = run(capsys, "optimize", tiny, "-o", locked / "out.pb")
    finally:
        locked.chmod(0o700)
    line = one_line_error(err)
    assert code == 2 and str(locked / "out.pb") in line and ".out.pb." not in line


def test_a_write_failure_as_root_names_the_users_path(tiny, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run(capsys, "optimize", tiny, "-o", blocker / "out.pb")
    line = one_line_error(err)
    assert code == 2 and str(blocker / "out.pb") in line and ".out.pb." not in line


def test_no_stage_points_to_the_cli_flag(tmp_path, capsys):
    path = tmp_path / "plain.pb"
    write_graph(no_stage_graph(), path)
    code, _, err = run(capsys, "optimize", path, "-o", tmp_path / "out.pb")
    line = one_line_error(err)
    assert code == 2 and "--auto-stage" in line and "enable_smart_stage" not in line
    assert not (tmp_path / "out.pb").exists()


# -- 4. a missing output port -------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--target", "--feed"])
def test_a_missing_output_port_is_refused(tiny, tmp_path, capsys, flag):
    code, _, err = run(capsys, "optimize", tiny, "-o", tmp_path / "out.pb", flag, "loss:7")
    line = one_line_error(err)
    assert code == 2 and "'loss'" in line and "1 output" in line and "no output 7" in line
    assert not (tmp_path / "out.pb").exists()


def test_explain_refuses_a_missing_output_port_as_optimize_does(tiny, capsys):
    code, _, err = run(capsys, "explain", tiny, "loss:7")
    line = one_line_error(err)
    assert code == 2 and "explain NODE 'loss:7'" in line and "1 output" in line and "no output 7" in line


# -- 3. verify keeps the cause ------------------------------------------------------------------------
def test_verify_names_the_unfed_placeholder_and_the_flag(tmp_path, capsys):
    path = queue_stage_meta(tmp_path / "fed.meta", unfed=True)
    code, _, err = run(capsys, "verify", path, "--steps", "2")
    line = one_line_error(err)
    assert code == 2 and "needs_feed" in line and "You must feed a value" in line and "--feed needs_feed=" in line
    code, out, err = run(capsys, "verify", path, "--steps", "2", "--feed", "needs_feed=1.5")
    assert code == 0 and "identical" in out, err


def test_verify_of_a_queue_stage_stops_its_prefetch_threads_at_once(tmp_path, capsys, caplog):
    path = queue_stage_meta(tmp_path / "queue.meta")
    with caplog.at_level(logging.WARNING):
        code, out, err = run(capsys, "verify", path, "--steps", "3")
    assert code == 0 and "identical" in out, err
    assert not [r for r in caplog.records if "still running" in r.getMessage()]  # no thread outlived its stop
    assert not [t for t in threading.enumerate() if t.name.startswith("smartstage-prefetch")]


@pytest.mark.parametrize("command", ["optimize", "explain", "verify"])
def test_feed_help_speaks_of_values_only_where_the_command_runs_the_graph(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    if command == "verify":
        assert "--feed NAME[=VALUE]" in out and "fed to it in both runs" in out
    else:
        assert "--feed NAME " in out and "VALUE" not in out and "verify" not in out.split("--feed", 1)[1][:200]
