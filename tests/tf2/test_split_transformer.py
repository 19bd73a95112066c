"""The op-level split of a transformer-style tf_keras train step (tests/tf2/transformer_model.py: looked-up ids,
embeddings, attention, layer norm, batch norm, dropout) in a custom loop, against the unsplit loop.

    before:  step = tf.function(model.train_step);  for batch in ds: step(batch)
    after:   split = ss.tf2.split(tf.function(model.train_step), ds);  for batch in split.dataset: split.step(batch)

Both loops start from the same weights (two models built from one seed) and read the same batches; every
step's outputs and then every weight are compared bit for bit.

split() traces the step once, for the dataset's element_spec (rows unknown), as model.fit traces its train
function, so one split serves every batch; the split is bit-identical to that trace. A loop that calls a
tf.function on concrete batches instead traces it for each new batch shape (20 rows, then 10 for a last
partial batch), and each trace is a program of its own:
- where the row count is static, the gradient of a mean (BatchNormalization's moments) divides by it as a
  constant, and Grappler's constant folding rewrites `x / 20.0` into `x * (1 / 20.0)`, which rounds
  differently in the last bit; with the row count unknown the division stays a division. With constant
  folding off (the `identical` fixture) the two give the same bits.
- a second trace (the partial batch) holds new random ops, whose sequence starts again from their seeds:
  that batch's Dropout masks are not the ones the first trace would have drawn.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import smartstage.tf2 as sst
from tests.tf2 import transformer_model as tm
from tests.tf2.fit_support import identical  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("eager", "identical")

SAMPLES = 200  # ten batches of 20
PARTIAL = 210  # ten batches of 20, then one of 10, which a per-batch-shape loop traces again for


def _values(outputs: dict) -> dict:
    return {name: np.asarray(value) for name, value in outputs.items()}


def unsplit_loop(model, dataset, traced_for_spec: bool = False) -> tuple[list, list]:
    """The user's loop: every step's outputs, then the weights. traced_for_spec: trace the step for the
    dataset's element_spec first, so every batch runs that one trace."""
    step = tf.function(model.train_step)
    if traced_for_spec:
        step.get_concrete_function(dataset.element_spec)
    outputs = [_values(step(batch)) for batch in dataset]
    return outputs, model.get_weights()


def split_loop(model, dataset) -> tuple[list, list]:
    split = sst.split(tf.function(model.train_step), dataset)
    outputs = [_values(split.step(batch)) for batch in split.dataset]
    return outputs, model.get_weights()


def differences(expected: tuple[list, list], got: tuple[list, list]) -> list[str]:
    """Every step output and weight that is not bit-identical, by name."""
    (expected_outputs, expected_weights), (outputs, weights) = expected, got
    assert len(expected_outputs) == len(outputs) > 0
    found = [f"step {i} {name}" for i, (a, b) in enumerate(zip(expected_outputs, outputs)) for name in a
             if not np.array_equal(a[name], b[name])]
    assert len(expected_weights) == len(weights)
    return found + [f"weight {k}" for k, (a, b) in enumerate(zip(expected_weights, weights))
                    if not np.array_equal(a, b)]


def split_against_unsplit(dataset, traced_for_spec: bool = False, **model) -> list[str]:
    """differences() of the split loop from the unsplit loop, each on a model built with `model`'s arguments."""
    expected = unsplit_loop(tm.behavior_sequence_transformer(**model), dataset, traced_for_spec)
    return differences(expected, split_loop(tm.behavior_sequence_transformer(**model), dataset))


def constant_folding_on() -> None:
    """Grappler's constant folding as TensorFlow runs it by default (the `identical` fixture puts it back)."""
    tf.config.optimizer.set_experimental_options({"constant_folding": True})


def test_split_loop_is_bit_identical_to_the_unsplit_loop():
    dataset = tm.rating_dataset(SAMPLES)
    expected = unsplit_loop(tm.behavior_sequence_transformer(), dataset)
    assert differences(expected, split_loop(tm.behavior_sequence_transformer(), dataset)) == []
    assert expected[0][0]["loss"] != expected[0][-1]["loss"]  # it trained


def test_verify_finds_every_step_and_variable_identical():
    model = tm.behavior_sequence_transformer()
    check = sst.verify(tf.function(model.train_step), tm.rating_dataset(SAMPLES), steps=10)
    assert check.identical, check.describe()
    moved = set(check.split.moved)
    # the id lookups moved into the dataset; the embeddings, attention and norms read trained variables and stay
    assert any(name.endswith("movie_lookup/None_Lookup/LookupTableFindV2") for name in moved)
    assert not any("embedding_lookup" in name.split("/")[-1] or "multi_head_attention" in name
                   or "layer_normalization" in name for name in moved)


def test_a_partial_last_batch_runs_the_split_as_the_step_traced_for_the_dataset_spec():
    dataset = tm.rating_dataset(PARTIAL)
    assert [int(labels.shape[0]) for _, labels in dataset][-2:] == [20, 10]
    assert split_against_unsplit(dataset, traced_for_spec=True) == []


def test_a_per_batch_shape_loop_retraced_for_the_partial_batch_differs_only_by_its_new_dropout_masks():
    dataset = tm.rating_dataset(PARTIAL)
    per_shape = unsplit_loop(tm.behavior_sequence_transformer(), dataset)
    split = split_loop(tm.behavior_sequence_transformer(), dataset)
    found = differences(per_shape, split)
    assert found and all(not d.startswith("step ") or d.startswith("step 10 ") for d in found)  # the 10-row batch on
    assert split_against_unsplit(dataset, dropout=0.0) == []


def test_with_constant_folding_the_split_equals_the_step_traced_for_the_dataset_spec():
    constant_folding_on()
    dataset = tm.rating_dataset(PARTIAL)
    assert split_against_unsplit(dataset, traced_for_spec=True) == []


def test_with_constant_folding_a_per_batch_shape_loop_differs_only_through_batch_norm():
    constant_folding_on()
    dataset = tm.rating_dataset(SAMPLES)
    assert split_against_unsplit(dataset) != []  # the static row count's reciprocal: see the module docstring
    # the same model without BatchNormalization: no mean's gradient over the rows, no difference
    assert split_against_unsplit(dataset, batch_norm=False) == []


def test_with_constant_folding_batches_of_one_static_shape_are_identical():
    # drop_remainder=True: the element_spec has the 20 rows every batch has, so both loops run one trace
    constant_folding_on()
    dataset = tm.rating_dataset(PARTIAL, drop_remainder=True)
    assert split_against_unsplit(dataset) == []


def test_split_leaves_the_users_step_tracing_as_it_would_have():
    # with constant folding on, a trace for the dataset's spec left in the step's cache would change what the
    # user's own loop computes afterwards (the reciprocal above, the partial batch's dropout masks)
    constant_folding_on()
    dataset = tm.rating_dataset(PARTIAL)
    expected = unsplit_loop(tm.behavior_sequence_transformer(), dataset)
    model = tm.behavior_sequence_transformer()
    step = tf.function(model.train_step)
    sst.split(step, dataset)
    assert step.experimental_get_tracing_count() == 0
    outputs = [_values(step(batch)) for batch in dataset]
    assert step.experimental_get_tracing_count() == 2  # 20 rows, then 10, as without split()
    assert differences(expected, (outputs, model.get_weights())) == []


def _optimized_graph(call):
    """The graph Grappler made of the largest function `call` runs (the train step)."""
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        call()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return max((f.post_optimization_graph for f in metadata.function_graphs), key=lambda g: len(g.node))


def _mean_gradients(graph) -> dict[str, str]:
    """{node: op} of the gradients of BatchNormalization's moments (the mean's and the variance's); the main
    side's nodes are imported under a scope of their own."""
    return {node.name: node.op for node in graph.node
            if "gradient_tape/" in node.name and re.search(r"/moments/truediv(_1)?$", node.name)}


def test_the_op_that_differs_is_the_mean_gradient_divided_by_the_static_row_count():
    constant_folding_on()
    dataset = tm.rating_dataset(SAMPLES)
    batch = next(iter(dataset))
    step = tf.function(tm.behavior_sequence_transformer().train_step)
    per_shape = _mean_gradients(_optimized_graph(lambda: step(batch)))
    split = sst.split(tf.function(tm.behavior_sequence_transformer().train_step), dataset)
    element = next(iter(split.dataset))
    main_side = _mean_gradients(_optimized_graph(lambda: split.step(element)))
    # two BatchNormalization layers, two divisions each, on both sides
    assert len(per_shape) == len(main_side) == 4
    assert set(per_shape.values()) == {"Mul"}  # x * (1 / 20.0): constant folding's reciprocal of the constant
    assert set(main_side.values()) == {"RealDiv"}  # x / the row count, computed: exact division
