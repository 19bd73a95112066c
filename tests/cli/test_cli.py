"""The `smartstage` command: every subcommand, its files, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from smartstage.cli.main import main
from smartstage.graph.load import load_graph, write_graph
from tests.bounds import JOB_HANG_SECONDS
from tests.builder import node
from tests.inspection.graphs import demo_example, no_stage_graph, tiny_graph

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_files(tmp_path):
    paths = {}
    for suffix in (".pb", ".pbtxt"):
        paths[suffix] = tmp_path / f"tiny{suffix}"
        write_graph(tiny_graph(), paths[suffix])
    return paths


@pytest.fixture(scope="module")
def demo_meta(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "demo.meta"
    write_graph(demo_example(path.parent), path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smartstage: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- optimize ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_optimize_keeps_the_format(tiny_files, tmp_path, capsys, suffix):
    out = tmp_path / f"out{suffix}"
    code, stdout, err = run(capsys, "optimize", tiny_files[suffix], "-o", out)
    assert code == 0, err
    assert "rewritten" in stdout and "q" in stdout and f"wrote {out}" in stdout
    if suffix == ".pbtxt":
        graph = text_format.Parse(out.read_text(), graph_pb2.GraphDef())
    else:
        graph = graph_pb2.GraphDef.FromString(out.read_bytes())
    assert list(node(graph, "put").input) == ["q", "hash", "as_number"]


def test_optimize_meta_with_every_report(demo_meta, tmp_path, capsys):
    out, report, page, logs = tmp_path / "fast.meta", tmp_path / "r.json", tmp_path / "r.html", tmp_path / "logs"
    code, stdout, err = run(capsys, "optimize", demo_meta, "-o", out, "--report", report, "--html", page,
                            "--tensorboard", logs, "--target", "predictions")
    assert code == 0, err
    meta = meta_graph_pb2.MetaGraphDef.FromString(out.read_bytes())
    assert "train_op" in meta.collection_def, "collections kept"
    assert "smartstage_stages" not in meta.collection_def  # the demo's tf.data stage folded into its dataset
    document = json.loads(report.read_text())
    assert document["schema"] == "smartstage.graph_diff" and document["counts"]["moved"] > 0
    assert [p["name"] for p in document["passes"]][:3] == ["find_stages", "partition", "expand_stage"]
    assert "predictions" in {p["name"] for p in document["pinned"]}
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in logs.iterdir()) == ["after", "before"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary file left"


def test_optimize_failure_leaves_no_output(tmp_path, capsys):
    src, out = tmp_path / "plain.pb", tmp_path / "out.pb"
    write_graph(no_stage_graph(), src)
    code, _, err = run(capsys, "optimize", src, "-o", out, "--report", tmp_path / "r.json")
    assert code == 2 and "no stage boundary" in one_line_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.pb"]


@pytest.mark.parametrize("argv, words", [
    (["optimize", "{dir}/missing.pb", "-o", "{dir}/out.pb"], "does not exist"),
    (["optimize", "{dir}/garbage.pb", "-o", "{dir}/out.pb"], "is not a valid binary GraphDef"),
    (["optimize", "{dir}/notes.txt", "-o", "{dir}/out.txt"], "unknown extension '.txt'"),
    (["optimize", "{dir}/tiny.pbtxt", "-o", "{dir}/out.pb"], "must have the format of IN (.pbtxt)"),
    (["optimize", "{dir}/tiny.pbtxt", "-o", "{dir}/out.pbtxt", "--target", "nope"], "'nope' names no node"),
    (["diff", "{dir}/tiny.pbtxt", "{dir}/missing.pbtxt"], "does not exist"),
    (["explain", "{dir}/tiny.pbtxt", "lokup"], "no node named 'lokup'; did you mean 'lookup'"),
    (["explain", "{dir}/plain.pbtxt", "y"], "no stage boundary"),
    (["verify", "{dir}/tiny.pbtxt"], "nothing to compare"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_files, tmp_path, capsys, argv, words):
    (tmp_path / "garbage.pb").write_bytes(b"\x07 this is not a protobuf \xff\xff")
    (tmp_path / "notes.txt").write_text("hello")
    write_graph(no_stage_graph(), tmp_path / "plain.pbtxt")
    code, _, err = run(capsys, *[a.format(dir=tmp_path) for a in argv])
    assert code == 2
    assert words in one_line_error(err)


@pytest.mark.parametrize("argv", [["optimize", "x.pb"], ["verify", "x.pb", "--steps", "0"], ["frobnicate"], []])
def test_wrong_flags_get_usage(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage: smartstage" in capsys.readouterr().err


# -- diff and explain ---------------------------------------------------------------------------------
def test_diff_text_json_and_pictures(tiny_files, tmp_path, capsys):
    after = tmp_path / "after.pbtxt"
    assert run(capsys, "optimize", tiny_files[".pbtxt"], "-o", after)[0] == 0
    code, text, _ = run(capsys, "diff", tiny_files[".pbtxt"], after, "--dot", tmp_path / "d.dot",
                        "--svg", tmp_path / "d.svg", "--html", tmp_path / "d.html")
    assert code == 0
    assert "moved to the prefetch side (3):" in text and "pinned ?" in text
    assert (tmp_path / "d.dot").read_text().startswith("digraph smartstage")
    assert (tmp_path / "d.svg").read_text().startswith("<svg")
    assert "Moved to the prefetch side (3)" in (tmp_path / "d.html").read_text()
    code, raw, _ = run(capsys, "diff", tiny_files[".pbtxt"], after, "--json")
    assert [m["name"] for m in json.loads(raw)["moved"]] == ["hash", "upper", "as_number"]


def test_explain(tiny_files, capsys):
    code, out, _ = run(capsys, "explain", tiny_files[".pb"], "total")
    assert code == 0
    assert out == ("'total' stays on the main side of stage 'q': it reads variable 'w' through 'loss', 'lookup', "
                   "'w/read'\n  chain: w -> w/read -> lookup -> loss -> total\n")
    code, out, _ = run(capsys, "explain", tiny_files[".pb"], "hash", "--json")
    assert json.loads(out)["verdict"] == "moved"


# -- verify and demo ----------------------------------------------------------------------------------
def test_verify_identical(demo_meta, capsys):
    code, out, err = run(capsys, "verify", demo_meta, "--steps", "3")
    assert code == 0, err
    assert out.startswith("verify: identical: 3 step(s)")


def test_verify_rejects_a_broken_rewrite(demo_meta, capsys, monkeypatch):
    import smartstage.optimizer as module

    real = module.optimize

    def broken(*args, **kwargs):
        result = real(*args, **kwargs)
        graph = result.meta_graph_def.graph_def  # the hash runs in the dataset's map since the stage folded
        hashes = [n for n in graph.node if n.name == "preprocess/hash_C1"] + [
            n for f in graph.library.function for n in f.node_def if n.name.endswith("preprocess/hash_C1")]
        hashes[0].attr["num_buckets"].i = 3
        return result

    monkeypatch.setattr(module, "optimize", broken)
    code, out, _ = run(capsys, "verify", demo_meta, "--steps", "2")
    assert code == 1
    assert out.startswith("verify: NOT identical: step 0: sigmoid_cross_entropy_loss/value:0 differs")
    # Fetching only the train op (no value) still compares what it trained: every variable after the run.
    code, out, _ = run(capsys, "verify", demo_meta, "--steps", "2", "--fetch", "train_op")
    assert code == 1
    assert out.startswith("verify: NOT identical: after the last step: variable ")


def test_demo(tmp_path, capsys):
    code, out, err = run(capsys, "demo", "--out", tmp_path)
    assert code == 0, err
    # the demo reads a one-shot tf.data iterator: its stage is folded into the dataset, 15 ops moved into the map
    assert "[folded into its dataset: the step reads 'stage/dataset_fold/IteratorGetNext']" in out
    assert "moved to the prefetch side (15):" in out and "preprocess/hash_C1 (StringToHashBucketFast)" in out
    assert "moved off the prefetch side" not in out
    assert {"before.meta", "after.meta", "report.html", "report.json"} <= {p.name for p in tmp_path.iterdir()}
    assert load_graph(tmp_path / "after.meta").meta_graph_def is not None


def test_a_real_process(tmp_path):
    """As users run it (a fresh process, eager mode on): TensorBoard runs, then an error as one clean line.
    One process for both keeps TensorFlow's import cost to one."""
    write_graph(tiny_graph(), tmp_path / "in.pbtxt")
    script = (
        "import sys\n"
        "from smartstage.cli import main\n"
        f"ok = main(['optimize', {str(tmp_path / 'in.pbtxt')!r}, '-o', {str(tmp_path / 'out.pbtxt')!r}, "
        f"'--tensorboard', {str(tmp_path / 'logs')!r}])\n"
        "print('exit', ok, file=sys.stderr)\n"
        f"sys.exit(main(['diff', {str(tmp_path / 'in.pbtxt')!r}, {str(tmp_path / 'missing.pb')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOB_HANG_SECONDS,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = done.stderr.strip().splitlines()
    assert "exit 0" in lines, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["after", "before"]
    assert done.returncode == 2
    assert lines[-1].startswith("smartstage: error: graph file") and "missing.pb" in lines[-1]
    assert "Traceback" not in done.stderr
