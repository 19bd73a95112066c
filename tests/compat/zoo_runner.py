"""Runs a model-zoo-style script of tests/compat/zoo in a fresh default graph, as `python <script> <flags>` would.

    result = run_zoo("dlrm", data_dir, tmp / "ckpt", ["--stage_threads", "1"])
    result.losses, result.acc, result.auc, result.checkpoint_dir, result.graph
    result = run_script("esmm", [...])        # the whole script as __main__: its guard, then main()
    checkpoint_values(result.checkpoint_dir)  # {variable: array} of the last checkpoint, to compare bitwise
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import tensorflow as tf

from smartstage.examples.data import write_criteo_csv

ZOO = Path(__file__).parent / "zoo"
MODELS = ("dlrm", "wide_and_deep", "deepfm", "dcnv2")

# The flags a port runs with on stock TensorFlow (docs/porting-deeprec.md): DeepRec's default optimizer
# and its Parquet input are DeepRec-only. Sizes are the test's: a few small batches.
# The string columns of the multi-task scripts' Taobao data (modelzoo/esmm/train.py HASH_INPUTS), after clk, buy.
TAOBAO_COLUMNS = ('pid', 'adgroup_id', 'cate_id', 'campaign_id', 'customer', 'brand', 'user_id', 'cms_segid',
                  'cms_group_id', 'final_gender_code', 'age_level', 'pvalue_level', 'shopping_level', 'occupation',
                  'new_user_class_level', 'tag_category_list', 'tag_brand_list', 'price')
TAOBAO_TAGS = ('tag_category_list', 'tag_brand_list')

PORT_FLAGS = ("--optimizer", "adam", "--parquet_dataset", "False", "--batch_size", "32", "--steps", "4",
              "--save_steps", "2")


@dataclass(frozen=True)
class ZooRun:
    losses: tuple
    acc: float
    auc: float
    checkpoint_dir: str
    graph: tf.Graph
    loss: str      # tensor names, for smartstage verify
    train_op: str


def write_data(directory: Path) -> str:
    """Criteo-format train.csv and eval.csv, as the model zoo's --data_location expects."""
    write_criteo_csv(directory / "train.csv", 96, seed=1)
    write_criteo_csv(directory / "eval.csv", 64, seed=2)
    return str(directory)


def run_zoo(model: str, data_dir: str, checkpoint_dir: Path, flags=()) -> ZooRun:
    """Runs the script's main() with `flags` after the port's flags; returns what it trained and evaluated."""
    names = runpy.run_path(str(ZOO / f"{model}.py"), run_name="zoo")
    argv = ["--data_location", data_dir, "--checkpoint", str(checkpoint_dir), *PORT_FLAGS, *flags]
    graph = tf.Graph()
    with graph.as_default():
        names["main"].__globals__["args"] = names["get_arg_parser"]().parse_args(argv)
        names["main"]()
    return _zoo_run(names["RESULTS"], graph)


def _zoo_run(results: dict, graph: tf.Graph) -> ZooRun:
    model = results["model"]
    return ZooRun(tuple(float(x) for x in results["losses"]), float(results.get("acc", "nan")),
                  float(results.get("auc", "nan")), results["checkpoint_dir"], graph, model.loss.name,
                  model.train_op.name)


def run_script(model: str, argv) -> ZooRun:
    """Runs tests/compat/zoo/<model>.py as `python <model>.py <argv>` would (its `__main__` block: the guard,
    then main()) in a fresh default graph; the process environment is left as it was."""
    graph = tf.Graph()
    with graph.as_default(), mock.patch.object(sys, "argv", [f"{model}.py", *map(str, argv)]), \
            mock.patch.dict(os.environ):
        names = runpy.run_path(str(ZOO / f"{model}.py"), run_name="__main__")
    return _zoo_run(names["RESULTS"], graph)


def write_taobao_data(directory: Path, train_rows: int = 96, test_rows: int = 64, int_ids: bool = False) -> str:
    """taobao_train_data and taobao_test_data as the multi-task scripts read them: clk, buy, then 18 string
    columns (the two tag lists '|'-separated), no header. int_ids: every column an integer id as in the real
    Taobao files, `price` under 50 (mmoe, dbmtl and ple read it as an int for an identity column)."""
    for name, rows, seed in (("taobao_train_data", train_rows, 3), ("taobao_test_data", test_rows, 4)):
        rng = np.random.default_rng(seed)
        with open(directory / name, "w") as f:
            for _ in range(rows):
                clk = int(rng.random() < 0.4)
                buy = int(clk and rng.random() < 0.5)
                prefix = (lambda column: "") if int_ids else (lambda column: f"{column}_")
                fields = [str(int(rng.integers(0, 50))) if int_ids and column == "price" else
                          f"{prefix(column)}{int(rng.zipf(1.5)) % 97}" if column not in TAOBAO_TAGS else
                          "|".join(f"{prefix(column)}{int(v)}" for v in rng.integers(0, 40, int(rng.integers(1, 4))))
                          for column in TAOBAO_COLUMNS]
                f.write(",".join([str(clk), str(buy), *fields]) + "\n")
    return str(directory)


def checkpoint_values(checkpoint_dir: str) -> dict[str, np.ndarray]:
    """Every variable of the latest checkpoint in `checkpoint_dir`, by name."""
    reader = tf.train.load_checkpoint(checkpoint_dir)
    return {name: reader.get_tensor(name) for name in sorted(reader.get_variable_to_shape_map())}


def assert_checkpoints_bitwise_equal(checkpoint_dir: str, reference_dir: str) -> None:
    """The two latest checkpoints hold the same variables with the same bytes (not just close values)."""
    got, expected = checkpoint_values(checkpoint_dir), checkpoint_values(reference_dir)
    assert sorted(got) == sorted(expected)
    different = [name for name in expected if got[name].dtype != expected[name].dtype
                 or got[name].shape != expected[name].shape or got[name].tobytes() != expected[name].tobytes()]
    assert not different, f"{len(different)} of {len(expected)} variables differ: {different[:5]}"


def load_zoo(model: str) -> dict:
    """The script's globals (its main() not run), for tests that call parts of it."""
    return runpy.run_path(str(ZOO / f"{model}.py"), run_name="zoo")
