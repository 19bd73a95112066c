"""The experts-and-gates multi-task look-alike (tests/compat/zoo/mmoe.py) runs whole, flag off and on, identically.

What DeepRec's real mmoe / ple / simple_multitask scripts do that esmm.py does not (run on stock TensorFlow by
issue 26's helper B2, /work/notes/issue-26-B2.md): `price` decoded as an int for an identity column, the
two labels kept as a [batch, 2] tensor, the dataset yielding (labels, features) with the labels first,
batch normalization in training mode (moving averages in UPDATE_OPS and in the checkpoint), softmax gates,
tf.keras.layers.Lambda, tf.layers.dense named '<scope>/dense'. Flag off is `--smartstaged False` (no stage:
what stock TensorFlow runs); flag on is the script's default. Losses of every step, eval ACC/AUC and the
final checkpoint, bit for bit, must be the same.
"""

from __future__ import annotations

import pytest

from smartstage.session.record import live_rewrite_of
from tests.compat.zoo_runner import assert_checkpoints_bitwise_equal, checkpoint_values, run_script, write_taobao_data


@pytest.fixture(scope="module")
def taobao_ids(tmp_path_factory) -> str:
    return write_taobao_data(tmp_path_factory.mktemp("taobao_ids"), int_ids=True)


def _multitask(data_dir, checkpoint_dir, *flags):
    return run_script("mmoe", ["--data_location", data_dir, "--checkpoint", checkpoint_dir, "--optimizer", "adam",
                               "--parquet_dataset", "False", "--batch_size", "32", "--steps", "4", *flags])


@pytest.fixture(scope="module")
def unstaged(taobao_ids, tmp_path_factory):
    return _multitask(taobao_ids, tmp_path_factory.mktemp("mmoe_off"), "--smartstaged", "False")


@pytest.mark.parametrize("threads", ["1", pytest.param("4", marks=pytest.mark.slow)])
def test_experts_gates_and_batch_norm_train_identically_flag_off_and_on(taobao_ids, unstaged, tmp_path, threads):
    assert len(unstaged.losses) == 4 and all(loss > 0 for loss in unstaged.losses)
    assert live_rewrite_of(unstaged.graph) is None
    values = checkpoint_values(unstaged.checkpoint_dir)
    # the patterns this look-alike exists for are in the trained model
    assert any("batch_normalization/moving_mean" in name for name in values)
    assert any(name.endswith("ctr_gate/kernel") for name in values)
    assert values["input_layer/input_layer/price_embedding/embedding_weights"].shape == (50, 8)

    run = _multitask(taobao_ids, tmp_path / "ckpt", "--stage_threads", threads)
    record = live_rewrite_of(run.graph)
    assert record is not None and record.changed and any(stage.moved for stage in record.stages)
    assert run.losses == unstaged.losses
    assert (run.acc, run.auc) == (unstaged.acc, unstaged.auc)
    assert_checkpoints_bitwise_equal(run.checkpoint_dir, unstaged.checkpoint_dir)


def test_price_as_a_string_stops_in_decode_csv_not_in_smartstage(tmp_path):
    # The script's own contract: its CSV reader wants an int price. Data written for esmm (hashed strings) fails in
    # TensorFlow's DecodeCSV, naming the field, flag on as off: nothing of SmartStage's in the way.
    data = write_taobao_data(tmp_path, 64, 32)
    with pytest.raises(Exception, match="not a valid int32"):
        _multitask(data, tmp_path / "ckpt", "--smartstaged", "False")
