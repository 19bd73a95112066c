"""The example builders in TensorFlow 2's default eager mode: the same graphs, the same losses as in graph mode.

    before:  build_dlrm(path, vocabularies)   # eager: TypeError: OwnedIterator.get_next() got ... 'name'
    after:   build_dlrm(path, vocabularies)   # eager: built into a tf.Graph of its own, model.graph

Every builder: build_dlrm, build_wide_deep, examples/device.build_device_model, deeprec_smart_stage_example
(build_demo: tests/tf2/test_eager_entry_points.py).

The child process (this file run as a script: no conftest, eager on) builds each example with `ss.staged` and
trains it with `run_steps`; the test process (graph mode, the suite's conftest) builds the same examples in
fresh graphs and compares the losses step by step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

RECORD = "examples.json"  # what the child writes (conftest's run_eager_child reads it)
STEPS = 5
ROWS = 256
KEYS = ("dlrm", "wide_deep", "device", "deeprec")  # device: examples/device.build_device_model (1 ms device wait)


def _graph_mode_run(tmp_path: Path) -> dict:
    import tensorflow as tf

    from smartstage import examples as ex

    files = ex.prepare_criteo(tmp_path / "graph", ROWS)
    data = ex.write_deeprec_example_data(tmp_path / "graph" / "1.txt")
    results = {}
    for key in KEYS:
        with tf.Graph().as_default():
            results[key] = _only(key, files, data)
    return results


def _only(key: str, files, data: str):
    """One example built with ss.staged and trained: in the default graph (graph mode), in a graph of its own
    (eager mode); its losses (the DeepRec example: its string targets)."""
    import smartstage as ss
    from smartstage import examples as ex

    if key == "deeprec":
        target = ex.deeprec_smart_stage_example(data, ss.staged, mark_target=ss.mark_target_node)
        return [[[cell.decode() for cell in row] for row in values.tolist()] for values in ex.run_steps(
            target.graph, target, 2, monitored=True, hooks=[ss.make_prefetch_hook()])]
    from smartstage.examples.device import build_device_model

    build = {"dlrm": ex.build_dlrm, "wide_deep": ex.build_wide_deep,
             "device": lambda *args, **kwargs: build_device_model(*args, device_ms=1.0, **kwargs)}[key]
    model = build(files.data_path, files.vocabulary_paths, stage_fn=ss.staged,
                  input_options=ex.InputOptions(reader="dataset", batch_size=32))
    return [float(values["loss"]) for values in ex.run_steps(
        model.graph, {"loss": model.loss, "train": model.train_op}, STEPS, monitored=True,
        hooks=[ss.make_prefetch_hook()])]


@pytest.fixture(scope="module")
def eager_run(run_eager_child) -> dict:
    return run_eager_child(__file__, RECORD)


def test_the_child_runs_eagerly(eager_run):
    assert eager_run["executing_eagerly"] is True


def test_examples_train_the_same_in_eager_and_graph_mode(eager_run, tmp_path):
    expected = _graph_mode_run(tmp_path)
    for key in ("dlrm", "wide_deep", "device"):
        assert len(eager_run["losses"][key]) == STEPS
        assert eager_run["losses"][key] == expected[key], key
    assert eager_run["losses"]["deeprec"] == expected["deeprec"]


def test_export_without_a_graph_names_the_fix_in_eager_mode(eager_run):
    assert eager_run["export_graph_def()"] == {
        "raised": "ValueError",
        "message": "export_graph_def(): in eager mode (TensorFlow 2's default) there is no default graph holding "
                   "the model; pass the model's graph (export_graph_def(model.graph)), or call "
                   "tf.compat.v1.disable_eager_execution() at program start",
    }


def test_every_example_builder_is_wrapped_for_eager_mode():
    # a builder added later without @builds_a_v1_graph would fail in eager mode as build_dlrm did
    from smartstage import examples as ex
    from smartstage.examples import device
    from smartstage.examples.graph_mode import builds_a_v1_graph

    wrapper_code = builds_a_v1_graph(lambda: None).__code__
    builders = {name: getattr(ex, name) for name in ex.__all__ if name.startswith("build_")}
    builders.update(deeprec_smart_stage_example=ex.deeprec_smart_stage_example,
                    build_device_model=device.build_device_model)
    assert {"build_dlrm", "build_wide_deep", "build_demo"} <= set(builders)
    unwrapped = sorted(name for name, builder in builders.items() if builder.__code__ is not wrapper_code)
    assert not unwrapped, f"builders without examples.graph_mode.builds_a_v1_graph: {unwrapped}"

def _child(out: Path) -> None:  # pragma: no cover - runs in the subprocess
    import tensorflow as tf

    from smartstage import examples as ex

    files = ex.prepare_criteo(out / "data", ROWS)  # the same rows and vocabularies as the parent's (seed 0)
    data = ex.write_deeprec_example_data(out / "data" / "1.txt")
    record = {"executing_eagerly": tf.executing_eagerly(),
              "losses": {key: _only(key, files, data) for key in KEYS}}
    try:
        ex.export_graph_def()
        record["export_graph_def()"] = {"raised": None}
    except Exception as error:  # noqa: BLE001  (recorded for the parent to judge)
        record["export_graph_def()"] = {"raised": type(error).__name__, "message": str(error)}
    (out / RECORD).write_text(json.dumps(record))


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
