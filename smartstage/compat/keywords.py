"""DeepRec-only keywords of stock APIs: accepted where the stock call computes the same, else one clear error.

    before:  tf.feature_column.linear_model(features, columns, do_fusion=True)   # TypeError inside TensorFlow
    after:   the stock linear_model(features, columns), logged once; adaptive_mask_tensors={...} on
             input_layer raises DeepRecFeatureError: ... run the script with --adaptive_emb False

DeepRec adds keywords to stock functions (feature columns, MonitoredTrainingSession); a model-zoo script
passes them under its flags. Each keyword here is either accepted (the stock call without it computes
the same values: DeepRec's fused lookups are faster kernels for the same sums) or refused with the
script flag that turns it off. A keyword that is neither stock nor listed raises DeepRecFeatureError
naming it, never a TypeError from inside TensorFlow. docs/porting-deeprec.md has the same table.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import tensorflow as _tf

from .deeprec_only import DeepRecFeatureError, log_once


@dataclass(frozen=True)
class DeepRecKeyword:
    """One DeepRec-only keyword of a stock API: accepted (why the stock call is the same) or refused (the flag)."""

    api: str
    name: str
    accepted: bool
    reason: str
    turn_off: str = ""

    def message(self) -> str:
        if self.accepted:
            return (f"{self.api}({self.name}=...) is DeepRec's ({self.reason}); stock TensorFlow has no such "
                    "keyword, so the stock call runs and computes the same values")
        return (f"{self.api}({self.name}=...) is DeepRec-only ({self.reason}); stock TensorFlow has no "
                f"equivalent: run the script with {self.turn_off}")


_FUSION = "DeepRec's fused embedding lookup: the same combiner over the same rows in one kernel"
_fc = "tf.feature_column."

KEYWORDS: dict[str, dict[str, DeepRecKeyword]] = {
    _fc + "embedding_column": {"do_fusion": DeepRecKeyword(_fc + "embedding_column", "do_fusion", True, _FUSION)},
    _fc + "shared_embedding_columns": {
        "do_fusion": DeepRecKeyword(_fc + "shared_embedding_columns", "do_fusion", True, _FUSION)},
    _fc + "linear_model": {
        "do_fusion": DeepRecKeyword(_fc + "linear_model", "do_fusion", True,
                                    "DeepRec's fused lookup of the categorical columns' weights: the same weighted "
                                    "sums in one kernel")},
    _fc + "input_layer": {
        "do_fusion": DeepRecKeyword(_fc + "input_layer", "do_fusion", True, _FUSION),
        "adaptive_mask_tensors": DeepRecKeyword(
            _fc + "input_layer", "adaptive_mask_tensors", False,
            "Adaptive Embedding: per-id masks choosing between a static table and an EmbeddingVariable",
            "--adaptive_emb False"),
    },
    "tf.train.MonitoredTrainingSession": {
        "save_incremental_checkpoint_secs": DeepRecKeyword(
            "tf.train.MonitoredTrainingSession", "save_incremental_checkpoint_secs", False,
            "DeepRec's incremental checkpoints, written by its own saver kernels",
            "--incremental_ckpt left out"),
    },
}


def _off(value: Any) -> bool:
    """A DeepRec keyword left at its default: the stock call is DeepRec's call."""
    return value is None or value is False or (isinstance(value, (dict, list, tuple, str)) and not value)


def with_deeprec_keywords(stock: Callable[..., Any], api: str) -> Callable[..., Any]:
    """`stock` taking the DeepRec keywords KEYWORDS lists for `api`: accepted ones dropped (logged once), refused
    ones and unknown ones raise DeepRecFeatureError.

        before:  tf.compat.v1.feature_column.linear_model(f, cols, do_fusion=True)   # TypeError
        after:   with_deeprec_keywords(linear_model, "tf.feature_column.linear_model")(f, cols, do_fusion=True)
    """
    parameters = inspect.signature(stock).parameters
    stock_names = [name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    known: Mapping[str, DeepRecKeyword] = KEYWORDS.get(api, {})

    @functools.wraps(stock)
    def call(*args: Any, **kwargs: Any) -> Any:
        for name in [n for n in kwargs if n not in stock_names]:
            keyword = known.get(name)
            if keyword is None:
                if takes_any:
                    continue
                raise DeepRecFeatureError(
                    f"{api}: argument {name!r} is neither stock TensorFlow's ({', '.join(stock_names)}) nor a "
                    "DeepRec keyword smartstage knows (docs/porting-deeprec.md); remove it from the call")
            value = kwargs.pop(name)
            if _off(value):
                continue
            if not keyword.accepted:
                raise DeepRecFeatureError(keyword.message())
            log_once(keyword.message())
        return stock(*args, **kwargs)

    return call


# DeepRec's values of a stock keyword: tf.distribute.Server(protocol=...) takes DeepRec's own transports.
DEEPREC_PROTOCOLS = {"grpc++": "DeepRec's gRPC++ transport", "star_server": "DeepRec's StarServer transport"}


class Server(_tf.compat.v1.distribute.Server):
    """tf.distribute.Server (tf.train.Server); DeepRec's protocols raise DeepRecFeatureError naming --protocol grpc.

        before:  tf.distribute.Server(cluster, job_name="ps", protocol="star_server")   # an error from the C++ server
        after:   DeepRecFeatureError: ... run the script with --protocol grpc
    """

    def __init__(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None, config=None,
                 start=True):
        if protocol in DEEPREC_PROTOCOLS:
            raise DeepRecFeatureError(
                f"tf.distribute.Server(protocol={protocol!r}) is DeepRec-only ({DEEPREC_PROTOCOLS[protocol]}); stock "
                "TensorFlow has no equivalent: run the script with --protocol grpc")
        super().__init__(server_or_cluster_def, job_name=job_name, task_index=task_index, protocol=protocol,
                         config=config, start=start)


_v1_fc = _tf.compat.v1.feature_column
embedding_column = with_deeprec_keywords(_v1_fc.embedding_column, _fc + "embedding_column")
shared_embedding_columns = with_deeprec_keywords(_v1_fc.shared_embedding_columns, _fc + "shared_embedding_columns")
linear_model = with_deeprec_keywords(_v1_fc.linear_model, _fc + "linear_model")
input_layer = with_deeprec_keywords(_v1_fc.input_layer, _fc + "input_layer")

FEATURE_COLUMN_APIS = {"embedding_column": embedding_column, "shared_embedding_columns": shared_embedding_columns,
                       "linear_model": linear_model, "input_layer": input_layer}

__all__ = ["DEEPREC_PROTOCOLS", "DeepRecKeyword", "FEATURE_COLUMN_APIS", "KEYWORDS", "Server", "with_deeprec_keywords"]
