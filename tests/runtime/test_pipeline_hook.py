"""make_pipeline_hook(): occupancy, waits, settings and a verdict per stage; scalars for TensorBoard.

The cases are lopsided on purpose, so the verdict does not depend on this machine's speed:
    input-bound:     range -> sleep 30 ms (prefetch side) -> put ~~ take -> identity        (0 ms step)
    training-bound:  range -> *2 (prefetch side)           -> put ~~ take -> sleep 30 ms   (the step)
"""

from __future__ import annotations

import glob
import threading
import time

import pytest
import tensorflow as tf

import smartstage as ss
from smartstage.runtime.hooks.pipeline_hook import INPUT_BOUND_WAIT, classify
from tests.runtime.helpers import RunCounter, bounded, lanes_config, range_input

SLEEP = 0.03


def _sleep_then(x):
    time.sleep(SLEEP)  # releases the GIL like a remote read; stateless so it may run on a lane
    return x


def _slow(x: tf.Tensor) -> tf.Tensor:
    return tf.numpy_function(_sleep_then, [x], tf.int64, stateful=False)


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for path in glob.glob(f"{logdir}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_a_slow_input_reads_input_bound_with_a_monitored_session(graph, tmp_path):
    y = ss.staged(_slow(range_input(10**6)), capacity=4, num_threads=1)
    hook = ss.make_pipeline_hook(every_n_steps=20, summary_dir=str(tmp_path), sample_every_n_steps=2)
    with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook(), hook], config=lanes_config()) as sess:
        got = [int(sess.run(y, options=bounded())) for _ in range(40)]
    assert got == list(range(40))   # watching changes nothing
    report = hook.last_report
    assert report is not None and report.stage == "stage" and report.step == 40 and report.steps == 20
    assert report.verdict == "input-bound", report.line
    assert report.line.startswith("stage 'stage' @ step 40: input-bound: the step waits")
    assert report.consumer_wait_ms / report.step_ms >= INPUT_BOUND_WAIT
    assert (report.num_threads, report.capacity, report.ordered, report.autotuned) == (1, 4, True, ("pool",))
    scalars = _scalars(str(tmp_path))
    for name in ("verdict", "steps_per_second", "step_ms", "consumer_wait_ms", "occupancy", "capacity",
                 "producer_ms", "producer_wait_ms", "batches_per_second", "num_threads"):
        assert [step for step, _ in scalars[f"smartstage/stage/{name}"]] == [20, 40], name
    assert scalars["smartstage/stage/verdict"][-1] == (40, 1.0)
    assert scalars["smartstage/stage/capacity"][-1] == (40, 4.0)


def test_a_slow_step_reads_training_bound_with_a_plain_session(graph, tmp_path):
    y = ss.staged(range_input(10**6) * 2, capacity=4, num_threads=1)
    step = _slow(y)   # the training step: 30 ms on the main side
    hook = ss.make_pipeline_hook(every_n_steps=15, summary_dir=str(tmp_path), sample_every_n_steps=1)
    with tf.compat.v1.Session(graph=graph) as sess, ss.start_prefetch_threads(sess):
        got = [int(hook.run(sess, step, options=bounded())) for _ in range(30)]
    assert got == [2 * i for i in range(30)]
    report = hook.last_report
    assert report.verdict == "training-bound", report.line
    assert "training-bound: the buffer stays full" in report.line and "steps/s" in report.line
    assert report.occupancy >= 2 and report.last_occupancy is not None
    assert _scalars(str(tmp_path))["smartstage/stage/verdict"] == [(15, -1.0), (30, -1.0)]


def test_settings_in_force_name_autotune_with_a_smartstage_session(graph):
    y = ss.staged(range_input(10**6))
    hook = ss.make_pipeline_hook(every_n_steps=10, log=False)
    with ss.Session(graph=graph, config=lanes_config()) as sess:   # starts its prefetch threads; the hook finds them
        for _ in range(10):
            hook.run(sess, y, options=bounded())
    report = hook.last_report
    assert report.autotuned == ("num_threads", "capacity", "pool")   # ss.Session has a prefetch pool to try
    assert "AUTOTUNE num_threads+capacity+pool" in report.line and "ordered" in report.line
    assert report.stats is not None and report.stats.stage == "stage"


@pytest.mark.parametrize("wait, fill, verdict", [
    (0.5, 0.0, "input-bound"), (0.2, 1.0, "input-bound"), (0.01, 1.0, "training-bound"),
    (0.01, None, "training-bound"), (0.01, 0.1, "balanced"), (0.1, 1.0, "balanced"), (None, 1.0, "unknown"),
])
def test_the_verdict_thresholds(wait, fill, verdict):
    assert classify(wait, fill) == verdict


def test_a_report_without_prefetch_threads_says_unknown(graph):
    y = ss.staged(range_input(10))
    hook = ss.make_pipeline_hook(every_n_steps=1, log=False)
    (report,) = hook.report(graph)
    assert report.verdict == "unknown" and report.stats is None
    with pytest.raises(ValueError, match="every_n_steps=0"):
        ss.make_pipeline_hook(every_n_steps=0)
    del y


def _folded_input(n: int, element_seconds: float, parallelism: int, buffer_size: int) -> tf.Tensor:
    """What passes/fold_dataset.py leaves: the stage's body in the dataset's map, then prefetch, and the step
    reading `stage/dataset_fold/IteratorGetNext` (no buffer, no StageDef, no prefetch thread).

        range -> map(sleep, parallel, deterministic) -> prefetch ==iterator==> stage/dataset_fold/IteratorGetNext
    """
    def slow(x):
        return tf.numpy_function(lambda v: (time.sleep(element_seconds), v)[1], [x], tf.int64, stateful=False)

    with tf.compat.v1.name_scope("stage/dataset_fold/"):
        dataset = tf.data.Dataset.range(n).map(slow, num_parallel_calls=parallelism, deterministic=True)
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(buffer_size))
        return iterator.get_next()


@pytest.mark.parametrize("input_seconds, step_seconds, verdict", [(SLEEP, 0.0, "input-bound"),
                                                                  (0.0, SLEEP, "training-bound")])
def test_a_folded_stage_gets_a_verdict_from_the_step_trace_alone(graph, monkeypatch, input_seconds, step_seconds,
                                                                   verdict):
    y = _folded_input(10**6, input_seconds, parallelism=1, buffer_size=3)
    step = tf.numpy_function(lambda v: (time.sleep(step_seconds), v)[1], [y], tf.int64, stateful=True)
    hook = ss.make_pipeline_hook(every_n_steps=20, log=False, sample_every_n_steps=2)
    with tf.compat.v1.Session(graph=graph) as sess:
        for _ in range(3):
            sess.run(step, options=bounded())  # tf.data builds its iterator on the first run
        counter = RunCounter(monkeypatch)
        got = [int(hook.run(sess, step, options=bounded())) for _ in range(40)]
    assert got == list(range(3, 43))
    assert counter.calls == 40  # one run a step, sampled steps included: the trace rides on the step's own run
    report = hook.reports["stage"]
    assert report.folded and report.verdict == verdict, report.line
    assert (report.num_threads, report.capacity, report.occupancy) == (1, 3, None)
    assert "folded into the dataset: map num_threads=1 prefetch=3" in report.line
    assert report.line.startswith(f"stage 'stage' @ step 40: {verdict}: the step waits")


def test_a_stage_the_session_folded_reads_input_bound_flag_off(graph, monkeypatch):
    """staged() on a tf.data iterator, flag off: the session folds the stage into its dataset (no thread, no
    StageDef); the hook still says the input is the limit, from the step's trace, one run a step."""
    iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(10**6))
    y = ss.staged(_slow(iterator.get_next()), capacity=3, num_threads=1)
    hook = ss.make_pipeline_hook(every_n_steps=20, log=False, sample_every_n_steps=2)
    scaffold = tf.compat.v1.train.Scaffold(local_init_op=iterator.initializer)
    with ss.MonitoredTrainingSession(hooks=[ss.make_prefetch_hook(), hook], scaffold=scaffold) as sess:
        assert ss.stage_defs(graph) == [] and [t for t in threading.enumerate() if "smartstage" in t.name] == []
        counter = RunCounter(monkeypatch)
        got = [int(sess.run(y, options=bounded())) for _ in range(40)]
    assert got == list(range(40))
    assert counter.calls == 40
    report = hook.reports["stage"]
    assert report.folded and report.verdict == "input-bound", report.line
    assert (report.num_threads, report.capacity) == (1, 3)
