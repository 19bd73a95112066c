"""The fold rewrites the map's body as the sessions that run the graph rewrite it: with Grappler when the config
given to optimize() leaves it on (a division by a constant becomes a multiplication by its reciprocal, as in the
step), as written when the config turns the meta optimizer off.

    before:  IteratorGetNext -> x / 100.0 -> put ~~ take -> mul(w) -> loss
    after (Grappler on):   map(x * 0.01)      after (disable_meta_optimizer):   map(x / 100.0)
"""

from __future__ import annotations

import tensorflow as tf

import smartstage as ss
from smartstage.config.options import options_from_config
from tests.passes.test_fold_dataset import lookup_graph


def _body_ops(meta_graph_def) -> set[str]:
    return {n.op for f in meta_graph_def.graph_def.library.function for n in f.node_def if n.name.startswith("body/")}


def _optimized(disable_meta_optimizer: bool):
    config = ss.enable_smart_stage(tf.compat.v1.ConfigProto())
    config.graph_options.rewrite_options.disable_meta_optimizer = disable_meta_optimizer
    meta = lookup_graph(body=lambda f: f["x"] / 100.0)
    return ss.optimize(meta, config, targets=["train", "loss"]).meta_graph_def


def test_the_session_config_decides_whether_the_body_is_rewritten():
    assert options_from_config(ss.enable_smart_stage(tf.compat.v1.ConfigProto())).session_rewrites
    as_written = ss.enable_smart_stage(tf.compat.v1.ConfigProto())
    as_written.graph_options.rewrite_options.disable_meta_optimizer = True
    assert not options_from_config(as_written).session_rewrites

    rewritten, written = _body_ops(_optimized(False)), _body_ops(_optimized(True))
    assert "RealDiv" not in rewritten and "Mul" in rewritten      # x * 0.01, as a session computes it
    assert "RealDiv" in written                                     # x / 100.0, as written
