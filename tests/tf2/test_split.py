"""split() on a DLRM-like custom loop: the preprocessing moves into the dataset, every loss and weight stays
identical to the unsplit program step by step, the user's step and dataset are untouched.

    before:  for batch in ds: step(batch)
    after:   ds2, step2 = ss.tf2.split(step, ds);  for batch in ds2: step2(batch)
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import smartstage.tf2 as sst
from tests.tf2.steps import BATCHES, dlrm_program, raw_dataset, run_losses

pytestmark = pytest.mark.usefixtures("eager")


def test_dlrm_step_losses_and_weights_identical_for_60_steps():
    reference = dlrm_program()
    expected = run_losses(reference.step, raw_dataset())
    program = dlrm_program()
    split = sst.split(program.step, raw_dataset())
    ds2, step2 = split
    got = run_losses(step2, ds2)
    assert len(got) == BATCHES == len(expected)
    assert got == expected  # bit-identical, step by step
    for a, b in zip(reference.weights(), program.weights()):
        np.testing.assert_array_equal(a, b)  # the user's own variables and Adam slots were trained


def test_what_moves_and_what_stays():
    program = dlrm_program()
    split = sst.split(program.step, raw_dataset())
    moved = set(split.moved)
    # the preprocessing: string split, hashing, the vocabulary lookup, bucketizing, the read-only scale
    assert {"StringSplit/StringSplitV2", "StringToHashBucketFast", "None_Lookup/LookupTableFindV2", "Bucketize",
            "mul"} <= moved
    # what reads a trained variable stays, with its reason
    assert "embedding_lookup" in split.pinned
    assert split.pinned["embedding_lookup"].kind == "variable"
    kinds = {s.kind for s in split.analysis.states}
    assert {"read_only_table", "read_only_variable", "variable"} <= kinds
    # each dataset element is the boundary, in order; the three int32[2] gradient shapes travel as one int32[6]
    packing = split.prefetch_function.packing
    assert [[split.boundary[k] for k in g] for g in packing.groups] == [[
        "gradient_tape/embedding_lookup/concat:0", "gradient_tape/embedding_lookup_2/concat:0",
        "gradient_tape/embedding_lookup_1/concat:0"]]
    assert len(split.dataset.element_spec) == packing.width == len(split.boundary) - 2
    assert split.dataset.element_spec[-1] == tf.TensorSpec([6], tf.int32)
    text = split.summary()
    assert "moved to the prefetch side" in text and "captured state" in text and "deterministic=True" in text


def test_the_users_dataset_and_step_are_untouched():
    program = dlrm_program()
    ds = raw_dataset()
    spec = ds.element_spec
    sst.split(program.step, ds)
    assert ds.element_spec == spec
    # the user's step still runs on raw batches and trains the same variables
    before = program.embedding.numpy().copy()
    program.step(next(iter(ds)))
    assert not np.array_equal(before, program.embedding.numpy())


def test_unordered_is_an_explicit_opt_out():
    program = dlrm_program()
    split = sst.split(program.step, raw_dataset(), deterministic=False)
    assert "num_parallel_calls=AUTOTUNE, deterministic=False" in split.summary()
    assert len(run_losses(split.step, split.dataset)) == BATCHES


def test_tuple_elements_and_unpacked_arguments():
    # for x, y in ds: step(x, y)  ->  for batch in ds2: step2(batch)
    w = tf.Variable([[0.5], [0.25]])

    @tf.function
    def step(x, y):
        feats = tf.stack([tf.strings.length(x), tf.cast(tf.strings.to_hash_bucket_fast(x, 10), tf.int32)], 1)
        pred = tf.matmul(tf.cast(feats, tf.float32), w)
        loss = tf.reduce_mean(tf.square(pred[:, 0] - y))
        w.assign_sub(0.001 * tf.ones_like(w) * loss)
        return loss

    ds = tf.data.Dataset.from_tensor_slices((["ab", "cde", "f", "ghij"] * 4, [1.0, 2.0, 3.0, 4.0] * 4)).batch(4)
    expected = [float(step(x, y)) for x, y in ds]
    w.assign([[0.5], [0.25]])
    split = sst.split(step, ds)
    assert "StringLength" in split.moved
    assert [float(split.step(batch)) for batch in split.dataset] == expected


def test_random_ops_stay_and_an_assert_moves_and_still_runs():
    w = tf.Variable(1.0)

    @tf.function
    def step(x):
        length = tf.cast(tf.strings.length(x), tf.float32)
        checked = tf.debugging.assert_less(length, 10.0)  # an Assert that guards the loss
        with tf.control_dependencies([checked]):
            noisy = length + tf.random.uniform(tf.shape(length), seed=3)  # a stateful random op
        loss = tf.reduce_sum(noisy * w)
        w.assign_add(0.01)
        return loss

    ds = tf.data.Dataset.from_tensor_slices(["ab", "cde", "f", "ghij"]).batch(2)
    split = sst.split(step, ds)
    assert "StringLength" in split.moved
    random = next(n for n in split.pinned if n.endswith("RandomUniform"))
    assert "smartstage/random_state" in split.pinned[random].describe()
    assert any("Assert" in n for n in split.moved)
    assert len([float(split.step(b)) for b in split.dataset]) == 2
    too_long = tf.data.Dataset.from_tensor_slices(["a" * 12]).batch(1)
    split = sst.split(step, too_long)
    with pytest.raises(tf.errors.InvalidArgumentError, match="assertion failed"):
        for batch in split.dataset:  # the moved Assert runs on the prefetch side, once per batch
            split.step(batch)


def test_jit_compile_compiles_the_main_side_only():
    w = tf.Variable([[0.5], [0.25]])

    @tf.function
    def step(x, y):
        feats = tf.stack([tf.strings.length(x), tf.cast(tf.strings.to_hash_bucket_fast(x, 10), tf.int32)], 1)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.cast(feats, tf.float32), w)[:, 0] - y))
        w.assign_sub(0.001 * tf.ones_like(w) * loss)
        return loss

    ds = tf.data.Dataset.from_tensor_slices((["ab", "cde", "f", "ghij"] * 4, [1.0, 2.0, 3.0, 4.0] * 4)).batch(4)
    expected = [float(step(x, y)) for x, y in ds]
    w.assign([[0.5], [0.25]])
    split = sst.split(step, ds, jit_compile=True)
    batch = next(iter(split.dataset))
    assert "HloModule" in split.main_function.experimental_get_compiler_ir(*batch)()  # XLA compiles it
    got = [float(split.step(b)) for b in split.dataset]
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # XLA may round differently: close, not identical


def test_ragged_input_and_a_dict_of_outputs():
    w = tf.Variable(tf.ones([10, 2]))

    @tf.function
    def step(batch):
        ids = tf.strings.to_hash_bucket_fast(batch["tags"], 10)  # a ragged batch of strings
        loss = tf.reduce_sum(tf.reduce_sum(tf.nn.embedding_lookup(w, ids.to_tensor()), 1) * batch["x"][:, None])
        w.assign_sub(0.01 * tf.ones_like(w))
        return {"loss": loss, "rows": tf.size(batch["x"])}

    tags = tf.ragged.constant([["a"], ["b", "c"], ["d", "e", "f"], ["g"]])
    ds = tf.data.Dataset.from_tensor_slices({"tags": tags, "x": [1.0, 2.0, 3.0, 4.0]}).batch(2)
    expected = [{k: float(v) for k, v in step(b).items()} for b in ds]
    w.assign(tf.ones([10, 2]))
    split = sst.split(step, ds)
    assert {"StringToHashBucketFast", "RaggedToTensor/RaggedTensorToTensor"} <= set(split.moved)
    assert [{k: float(v) for k, v in split.step(b).items()} for b in split.dataset] == expected


def test_a_custom_loop_around_a_keras_model_with_preprocessing_layers():
    # the common TF2 pattern: model(x) inside a tf.function step; the layers' tables are found through the model
    import keras

    from tests.tf2.keras_models import preprocessing_model, raw_dataset as keras_dataset

    def program():
        model, optimizer, mse = preprocessing_model(), keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError()

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = mse(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return model, step

    reference, reference_step = program()
    expected = [float(reference_step(x, y)) for x, y in keras_dataset()]
    model, step = program()
    split = sst.split(step, keras_dataset())
    assert any("city_lookup" in n and n.endswith("LookupTableFindV2") for n in split.moved)
    assert any("age_bins" in n and n.endswith("Bucketize") for n in split.moved)
    assert [float(split.step(batch)) for batch in split.dataset] == expected
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_batches_arrive_in_input_order_and_a_step_may_return_nothing():
    seen = tf.Variable(tf.zeros([0], tf.int64), shape=[None])

    @tf.function
    def step(batch):  # returns nothing: its effect is the update
        slow = tf.strings.reduce_join(tf.strings.split(batch["text"], " "), axis=-1)  # moves, takes a while
        ids = batch["id"] + tf.cast(tf.strings.length(slow) * 0, tf.int64)
        seen.assign(tf.concat([seen, ids], 0))

    n = 64
    ds = tf.data.Dataset.from_tensor_slices({"id": tf.range(n, dtype=tf.int64),
                                             "text": [" ".join(["w"] * (i % 7 + 1)) for i in range(n)]}).batch(2)
    split = sst.split(step, ds)
    assert all(split.step(batch) is None for batch in split.dataset)
    assert seen.numpy().tolist() == list(range(n))  # a parallel map, and every batch in input order


def test_the_summary_states_the_maps_threads():
    split = sst.split(dlrm_program().step, raw_dataset(), num_threads=3)
    assert split.num_threads == 3 and "map(prefetch side, num_parallel_calls=3, deterministic=True)" in split.summary()


def test_an_imported_side_drops_mapped_and_unread_placeholders_with_their_colocation():
    from smartstage.tf2.step.functions import without_mapped
    from tests.builder import G, N

    g = G(N("batch", "Placeholder", dtype=tf.float32),
          N("table", "Placeholder", dtype=tf.resource),
          N("kept", "Placeholder", dtype=tf.float32),
          N("hash", "Identity", ["batch", "kept"], T=tf.float32, _class=[b"loc:@batch", b"loc:@kept"]))
    out = without_mapped(g, ["batch:0"])
    assert [(n.name, list(n.input)) for n in out.node] == [("kept", []), ("hash", ["batch", "kept"])]
    assert list(out.node[1].attr["_class"].list.s) == [b"loc:@kept"]
