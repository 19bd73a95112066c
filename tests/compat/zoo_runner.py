"""Runs a model-zoo-style script of tests/compat/zoo in a fresh default graph, as `python <script> <flags>` would.

    result = run_zoo("dlrm", data_dir, tmp / "ckpt", ["--stage_threads", "1"])
    result.losses, result.acc, result.auc, result.checkpoint_dir, result.graph
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from smartstage.examples.data import write_criteo_csv

ZOO = Path(__file__).parent / "zoo"
MODELS = ("dlrm", "wide_and_deep", "deepfm", "dcnv2")

# The flags a port runs with on stock TensorFlow (docs/porting-deeprec.md): DeepRec's default optimizer
# and its Parquet input are DeepRec-only. Sizes are the test's: a few small batches.
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
    results = names["RESULTS"]
    model = results["model"]
    return ZooRun(tuple(float(x) for x in results["losses"]), float(results.get("acc", "nan")),
                  float(results.get("auc", "nan")), results["checkpoint_dir"], graph, model.loss.name,
                  model.train_op.name)


def load_zoo(model: str) -> dict:
    """The script's globals (its main() not run), for tests that call parts of it."""
    return runpy.run_path(str(ZOO / f"{model}.py"), run_name="zoo")
