"""Every public entry point in TensorFlow 2's default eager mode: it works, or it raises EagerModeError naming the fix.

    before:  ss.staged(x)   # eager: AttributeError: Tensor.graph is undefined when eager execution is enabled
    after:   ss.staged(x)   # eager: EagerModeError: staged(): was called in eager mode ...; use smartstage.tf2 ...

The suite's conftest turns eager execution off for the whole test process, so the calls run in a child
process started from this file (`python tests/tf2/test_eager_entry_points.py <dir>`: no conftest, eager on,
as a user's script). The child prints one JSON record per call: what it returned or raised. The v1 entry
points are also called inside `with tf.Graph().as_default():` of that eager program, where they must work
(a v1 graph built on purpose), and the demo model trains there with the same losses as in graph mode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

RECORD = "calls.json"  # what the child writes (conftest's run_eager_child reads it)
STEPS = 6

# Public names that are not called: exception types, constants, and result types that entry points return.
NOT_CALLED = {
    "SmartStageError", "ConfigError", "GraphError", "NoStageError", "PassError", "StageRuntimeError", "TargetError",
    "VerificationError", "EagerModeError", "SplitError", "NothingToMoveError", "AUTOTUNE", "STAGES_COLLECTION", "TARGETS_COLLECTION",
    "Comparison", "Explanation", "GraphDiff", "LiveRewrite", "OptimizeResult", "RewriteCheck", "PipelineReport",
    "PrefetchThreads", "SmartMonitoredSession", "DeepRecFeatureError", "InputTaskError", "StateChangedError",
    "LoopbackClusterError", "GraphvizMissing",
    "LoopbackCluster",  # starts TF servers on loopback ports: tests/cluster and tests/inspection run it
}

# name -> what each call does in the eager program: "works", or "EagerModeError" with words its message must hold.
EAGER = {
    "staged": ("EagerModeError", ["staged()", "eager mode", "smartstage.tf2", "disable_eager_execution()"]),
    "mark_target_node": ("EagerModeError", ["mark_target_node()", "smartstage.tf2", "disable_eager_execution()"]),
    "PrefetchHook.begin": ("EagerModeError", ["PrefetchHook.begin()", "MonitoredTrainingSession",
                                              "graph.as_default()", "smartstage.tf2"]),
    "Session": ("EagerModeError", ["smartstage.Session()", "graph=", "disable_eager_execution()"]),
    "MonitoredTrainingSession": ("EagerModeError", ["smartstage.MonitoredTrainingSession()", "smartstage.tf2"]),
    "optimize": ("EagerModeError", ["a tf.function", "smartstage.tf2", "get_concrete_function"]),
    "explain": ("EagerModeError", ["a Keras model", "smartstage.tf2"]),
    "graph_diff": ("EagerModeError", ["an eager tensor", "smartstage.tf2"]),
    "verify_rewrite": ("EagerModeError", ["a tf.data.Dataset", "smartstage.tf2"]),
    "load_graph": ("EagerModeError", ["a ConcreteFunction", "get_concrete_function"]),
}
# name -> works in the eager program on what it takes there (a graph, a file, a session of a v1 graph)
WORKS = {"GraphView", "text_report", "json_report", "html_report", "dot_source", "svg_drawing", "write_tensorboard",
         "stage_placements", "placement_lines", "run_initializer",
         "make_prefetch_hook", "PrefetchHook", "make_pipeline_hook", "PipelineHook", "Session(graph=)",
         "start_prefetch_threads", "live_rewrite_of", "optimize(meta)", "explain(meta)",
         "graph_diff(meta)", "verify_rewrite(meta)", "run_steps", "compare_runs", "load_graph(file)", "write_graph",
         "enable_smart_stage", "options_from_config", "to_session_config", "ConfigProto", "SmartStageOptions",
         "AutoStageOptions", "stage_defs", "stage_defs_from_meta_graph", "target_node_names",
         "optimize(FuncGraph)"}
# name -> works inside `with tf.Graph().as_default():` of the eager program
IN_GRAPH = {"staged", "mark_target_node", "make_prefetch_hook", "make_pipeline_hook", "Session()",
            "MonitoredTrainingSession"}  # the session with a hook made eagerly (docs/examples.md does that)


@pytest.fixture(scope="module")
def eager_calls(run_eager_child) -> dict:
    return run_eager_child(__file__, RECORD)


def test_every_public_entry_point_is_called_in_eager_mode():
    import smartstage

    called = {name.split("(")[0].split(".")[0] for name in set(EAGER) | WORKS | IN_GRAPH}
    missing = sorted(set(smartstage.__all__) - NOT_CALLED - called)
    assert not missing, f"public names not called in eager mode by this test: {missing}"


def test_the_child_runs_eagerly(eager_calls):
    assert eager_calls["executing_eagerly"] is True


@pytest.mark.parametrize("name", sorted(EAGER))
def test_a_v1_entry_point_in_eager_mode_names_the_fix(eager_calls, name):
    kind, words = EAGER[name]
    call = eager_calls["eager"][name]
    assert call["raised"] == kind, call
    assert all(word in call["message"] for word in words), call["message"]
    assert "\n" not in call["message"]


@pytest.mark.parametrize("name", sorted(WORKS))
def test_an_entry_point_that_takes_a_graph_works_in_eager_mode(eager_calls, name):
    call = eager_calls["works"][name]
    assert call["raised"] is None, call


@pytest.mark.parametrize("name", sorted(IN_GRAPH))
def test_a_v1_entry_point_works_inside_a_graph_of_an_eager_program(eager_calls, name):
    call = eager_calls["in_graph"][name]
    assert call["raised"] is None, call


def test_the_demo_trains_the_same_in_an_eager_program_as_in_graph_mode(eager_calls, tmp_path):
    import tensorflow as tf

    import smartstage as ss
    from smartstage.examples import build_demo, write_criteo_csv

    assert not tf.executing_eagerly()  # this process: the suite's graph mode
    data = write_criteo_csv(tmp_path / "demo.csv", 256, seed=0)
    with tf.Graph().as_default():
        model = build_demo(data, stage_fn=ss.staged)
        with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook()], log_step_count_steps=None,
                                         save_summaries_steps=None, save_checkpoint_secs=None) as sess:
            losses = [float(sess.run([model.loss, model.train_op])[0]) for _ in range(STEPS)]
    assert len(losses) == STEPS
    assert eager_calls["losses"]["MonitoredTrainingSession"] == losses
    assert eager_calls["losses"]["Session(graph=)"] == losses


# ---- the child process: a user's script in TensorFlow 2's default eager mode ----

def _record(fn) -> dict:
    try:
        value = fn()
    except Exception as error:  # noqa: BLE001  (recorded for the parent to judge)
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None, "returned": type(value).__name__}


def _child(out: Path) -> None:  # pragma: no cover - runs in the subprocess
    import keras
    import tensorflow as tf

    import smartstage as ss
    from smartstage.examples import build_demo, export_meta_graph_def, write_criteo_csv

    data = write_criteo_csv(out / "demo.csv", 256, seed=0)
    x = tf.constant([1.0, 2.0])

    @tf.function
    def step(batch):
        return batch * 2.0

    concrete = step.get_concrete_function(tf.TensorSpec([2], tf.float32))
    model = build_demo(data, stage_fn=ss.staged)  # eager: its own tf.Graph
    meta = export_meta_graph_def(model.graph)
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto())
    keras_model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    record = {"executing_eagerly": tf.executing_eagerly(), "eager": {}, "works": {}, "in_graph": {}, "losses": {}}

    eager = {
        "staged": lambda: ss.staged(x),
        "mark_target_node": lambda: ss.mark_target_node(x),
        "PrefetchHook.begin": lambda: ss.make_prefetch_hook().begin(),
        "Session": lambda: ss.Session(config=config),
        "MonitoredTrainingSession": ss.MonitoredTrainingSession,
        "optimize": lambda: ss.optimize(step, config),
        "explain": lambda: ss.explain(keras_model, "dense"),
        "graph_diff": lambda: ss.graph_diff(x, meta),
        "verify_rewrite": lambda: ss.verify_rewrite(tf.data.Dataset.range(3)),
        "load_graph": lambda: ss.load_graph(concrete),
    }
    record["eager"] = {name: _record(fn) for name, fn in eager.items()}

    def train_in_session() -> list[float]:
        with ss.Session(graph=model.graph) as sess:
            sess.run(model.init_op)
            return [float(sess.run([model.loss, model.train_op])[0]) for _ in range(STEPS)]

    def prefetch_by_hand():
        with ss.Session(graph=model.graph, prefetch=False) as sess:
            sess.run(model.init_op)
            threads = ss.start_prefetch_threads(sess)
            sess.run(model.loss)
            threads.stop()
            return ss.live_rewrite_of(sess)

    def run_initializer_by_hand():
        with ss.Session(graph=model.graph, prefetch=False) as sess:
            threads = ss.start_prefetch_threads(sess)
            ss.run_initializer(sess, threads, model.init_op)
            threads.stop()

    result = ss.optimize(meta, config)
    path = str(out / "demo.meta")
    works = {
        "make_prefetch_hook": ss.make_prefetch_hook,
        "PrefetchHook": ss.PrefetchHook,
        "make_pipeline_hook": ss.make_pipeline_hook,
        "PipelineHook": ss.PipelineHook,
        "Session(graph=)": lambda: record["losses"].__setitem__("Session(graph=)", train_in_session()),
        "start_prefetch_threads": prefetch_by_hand,
        "live_rewrite_of": prefetch_by_hand,
        "optimize(meta)": lambda: ss.optimize(meta, config),
        "optimize(FuncGraph)": lambda: ss.optimize(concrete.graph),
        "explain(meta)": lambda: ss.explain(meta, "preprocess/hash_C1", config=config, result=result),
        "graph_diff(meta)": lambda: ss.graph_diff(meta, result.meta_graph_def, result),
        "verify_rewrite(meta)": lambda: ss.verify_rewrite(meta, 3, fetches=[model.loss.name], config=config),
        "run_steps": lambda: ss.run_steps(meta, ["preprocess/hash_C1:0"], 2),
        "compare_runs": lambda: ss.compare_runs(meta, result.meta_graph_def, ["preprocess/hash_C1:0"], 2,
                                                after_fetches=[result.fetch_map()["preprocess/hash_C1:0"]]),
        "write_graph": lambda: ss.write_graph(meta, path),
        "load_graph(file)": lambda: ss.load_graph(path),
        "enable_smart_stage": lambda: ss.enable_smart_stage(tf.compat.v1.ConfigProto()),
        "options_from_config": lambda: ss.options_from_config(config),
        "to_session_config": lambda: ss.to_session_config(config),
        "ConfigProto": ss.ConfigProto,
        "SmartStageOptions": ss.SmartStageOptions,
        "AutoStageOptions": ss.AutoStageOptions,
        "stage_defs": lambda: ss.stage_defs(model.graph),
        "stage_defs_from_meta_graph": lambda: ss.stage_defs_from_meta_graph(meta),
        "target_node_names": lambda: ss.target_node_names(model.graph),
        "GraphView": lambda: ss.GraphView(meta.graph_def),
        "text_report": lambda: ss.text_report(result.diff()),
        "json_report": lambda: ss.json_report(result.diff()),
        "html_report": lambda: ss.html_report(result.diff(), result),
        "dot_source": lambda: ss.dot_source(result.diff()),
        "svg_drawing": lambda: ss.svg_drawing(result.diff()),
        "write_tensorboard": lambda: ss.write_tensorboard(meta, result.meta_graph_def, str(out / "tensorboard")),
        "stage_placements": lambda: ss.stage_placements(result.meta_graph_def.graph_def),
        "placement_lines": lambda: ss.placement_lines(ss.stage_placements(result.meta_graph_def.graph_def)),
        "run_initializer": run_initializer_by_hand,
    }
    record["works"] = {name: _record(fn) for name, fn in works.items()}

    def monitored() -> None:
        hook = ss.make_prefetch_hook()  # made eagerly, begun in the graph
        with model.graph.as_default():
            with ss.MonitoredTrainingSession(hooks=[hook], log_step_count_steps=None,
                                             save_summaries_steps=None, save_checkpoint_secs=None) as sess:
                record["losses"]["MonitoredTrainingSession"] = [
                    float(sess.run([model.loss, model.train_op])[0]) for _ in range(STEPS)]

    def in_graph(fn):
        def call():
            with tf.Graph().as_default():
                return fn(tf.constant([1.0, 2.0]))
        return call

    record["in_graph"] = {
        "staged": _record(in_graph(ss.staged)),
        "mark_target_node": _record(in_graph(ss.mark_target_node)),
        "make_prefetch_hook": _record(in_graph(lambda _: ss.make_prefetch_hook())),
        "make_pipeline_hook": _record(in_graph(lambda _: ss.make_pipeline_hook())),
        "Session()": _record(in_graph(lambda t: ss.Session().close())),
        "MonitoredTrainingSession": _record(monitored),
    }
    (out / RECORD).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
