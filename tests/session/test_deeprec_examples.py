"""DeepRec-style scripts (tests/deeprec_scripts.py) run on stock TensorFlow with only their import changed.

What each prints is captured and compared with the same script on the unoptimized graph, step by step.
"""

from __future__ import annotations

import inspect

import pytest
import tensorflow as tf

from smartstage.examples.data import write_deeprec_example_data
from tests.deeprec_scripts import (
    FLAG_LINE,
    MONITORED_ENDING,
    PLAIN_ENDING,
    SMART_STAGE_SCRIPT,
    STAGE_SCRIPT,
    run_script,
    unstaged,
)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    return write_deeprec_example_data(tmp_path_factory.mktemp("deeprec") / "1.txt")


def test_stage_example_prints_the_values_of_the_unstaged_graph(data_file):
    printed, names = run_script(STAGE_SCRIPT, data_file)
    reference, _ = run_script(unstaged(STAGE_SCRIPT), data_file)
    assert len(printed) == 5
    assert printed == reference
    assert "value0" in printed[0] and "xxx" in printed[0]
    record = names["sess"].smart_stage                # no flag: nothing expands (a tf.data stage folds)
    assert record is None or all(s.folded_into for s in record.stages)


def test_smart_stage_example_prints_the_values_of_the_unoptimized_graph(data_file):
    optimized, names = run_script(SMART_STAGE_SCRIPT, data_file)
    unoptimized, plain_names = run_script(SMART_STAGE_SCRIPT.replace(FLAG_LINE, ""), data_file)
    reference, _ = run_script(unstaged(SMART_STAGE_SCRIPT), data_file)
    assert len(optimized) == 5
    assert optimized == unoptimized == reference
    record = names["sess"].smart_stage
    assert record is not None and record.changed
    (stage,) = record.stages
    moved_types = {names["target"].graph.get_operation_by_name(n).type for n in stage.moved}
    assert {"StringToHashBucket", "ConcatV2"} <= moved_types
    assert plain_names["sess"].smart_stage is None or all(s.folded_into for s in plain_names["sess"].smart_stage.stages)


def test_smart_stage_example_on_a_plain_session_prints_the_same_values(data_file):
    script = SMART_STAGE_SCRIPT.replace(MONITORED_ENDING, PLAIN_ENDING)
    assert script != SMART_STAGE_SCRIPT
    optimized, names = run_script(script, data_file)
    reference, _ = run_script(unstaged(SMART_STAGE_SCRIPT), data_file)
    assert len(optimized) == 5 and optimized == reference
    assert names["sess"].smart_stage.changed


def test_the_compat_namespace_is_deeprecs_api_on_tf_compat_v1():
    from smartstage import compat
    import smartstage as ss

    assert compat.tf.staged is ss.staged and compat.tf.make_prefetch_hook is ss.make_prefetch_hook
    assert compat.tf.ConfigProto is ss.ConfigProto and compat.tf.Session is ss.Session
    # SmartStage's session behind DeepRec's own keywords (compat.keywords: save_incremental_checkpoint_secs is
    # refused naming the script flag; issue 26), not a TypeError from the stock signature.
    assert inspect.unwrap(compat.tf.train.MonitoredTrainingSession) is ss.MonitoredTrainingSession
    assert compat.tf.train.mark_target_node is ss.mark_target_node
    assert compat.tf.decode_csv is tf.compat.v1.decode_csv
    assert compat.tf.train.batch is tf.compat.v1.train.batch
