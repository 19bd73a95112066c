"""`smartstage verify` on the graphs the model-zoo-style scripts export (staged, before any rewrite)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.cli.main import main as smartstage_main
from tests.compat.zoo_runner import MODELS, run_zoo, write_data


def _with_iterator_initializer(path: str) -> None:
    # The scripts' iterator is made by Iterator.from_structure and initialised by the Scaffold's
    # local_init_op; verify runs the variable and table initializers only, so the train data's
    # MakeIterator (the first one built) is listed with the table initializers of this copy.
    meta = tf.compat.v1.MetaGraphDef()
    with open(path, "rb") as f:
        meta.ParseFromString(f.read())
    make_iterator = next(n.name for n in meta.graph_def.node if n.op == "MakeIterator")
    meta.collection_def[tf.compat.v1.GraphKeys.TABLE_INITIALIZERS].node_list.value.append(make_iterator)
    with open(path, "wb") as f:
        f.write(meta.SerializeToString())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return write_data(tmp_path_factory.mktemp("criteo"))


@pytest.mark.parametrize("model", MODELS)
def test_verify_finds_the_rewrite_of_the_exported_graph_identical(model, data_dir, tmp_path):
    meta = str(tmp_path / f"{model}.meta")
    run = run_zoo(model, data_dir, tmp_path / "ckpt",
                  ["--do_smart_stage", "False", "--stage_threads", "1", "--steps", "1", "--no_eval",
                   "--export_meta", meta])
    _with_iterator_initializer(meta)
    code = smartstage_main(["verify", meta, "--steps", "3", "--fetch", run.loss, "--fetch", run.train_op])
    assert code == 0
