"""Every input ss.tf2.fit cannot train is a SplitError naming the cause and the fix, raised before anything
changes: the model's weights, its train function and its step methods are as they were.

    before:  ss.tf2.fit(model, (x, y), epochs=1)        # arrays
    after:   SplitError: fit(): dataset is a tuple; pass a batched tf.data.Dataset of (features, labels) ...
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tf_keras

import smartstage.tf2 as sst
from smartstage.errors import SplitError
from tests.tf2 import fit_models as fm

pytestmark = pytest.mark.usefixtures("eager")
KEYS = ("user", "item")


def _uncompiled_tf_keras():
    tf_keras.utils.set_random_seed(1)
    return fm.Ranking()


def _uncompiled_keras3():
    return fm.Keras3Ranker(name="uncompiled")


def _run_eagerly(factory):
    def build():
        model = factory()
        model.compile(type(model.optimizer)(0.01), "mse", run_eagerly=True)
        return model
    return build


CASES = {
    # name: (model factory, call arguments besides the model, the message's pattern)
    "not_a_model": (lambda: object(), lambda: (fm.dataset(KEYS),), {}, r"object is not a Keras model; pass a keras"),
    "arrays": (fm.ranking_tf_keras, lambda: (fm.columns(),), {}, r"dataset is a tuple; pass a batched tf\.data"),
    "validation_arrays": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS),), {"validation_data": fm.columns()},
                          r"validation_data is a tuple; pass a batched tf\.data\.Dataset"),
    "y": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS),), {"y": np.ones(3)},
          r"y= describes in-memory arrays.*labels are the dataset's second component"),
    "sample_weight": (fm.keras3_subclassed, lambda: (fm.dataset(KEYS),), {"sample_weight": np.ones(3)},
                      r"sample_weight= .*third component"),
    "validation_split": (fm.keras3_subclassed, lambda: (fm.dataset(KEYS),), {"validation_split": 0.2},
                         r"validation_split= .*validation_data=<a batched tf\.data\.Dataset>"),
    "batch_size": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS),), {"batch_size": 4},
                   r"batch_size= .*dataset\.batch\(n\)"),
    "x_keyword": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS),), {"x": fm.columns()[0]},
                  r"data is the second argument.*drop x="),
    "uncompiled_tf_keras": (_uncompiled_tf_keras, lambda: (fm.dataset(KEYS),), {},
                            r"'ranking' is not compiled; call model\.compile"),
    "uncompiled_keras3": (_uncompiled_keras3, lambda: (fm.dataset(KEYS),), {},
                          r"'uncompiled' is not compiled; call model\.compile"),
    "run_eagerly_tf_keras": (_run_eagerly(fm.ranking_tf_keras), lambda: (fm.dataset(KEYS),), {},
                             r"'ranking' is compiled with run_eagerly=True.*run_eagerly=False for ss\.tf2\.fit"),
    "run_eagerly_keras3": (_run_eagerly(fm.keras3_subclassed), lambda: (fm.dataset(KEYS + ("age",)),), {},
                           r"'keras3_ranker' is compiled with run_eagerly=True"),
    "misspelled_argument": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS),), {"epoch": 2},
                            r"fit takes no argument 'epoch'; did you mean 'epochs'\?"),
    "misspelled_argument_keras3": (fm.keras3_subclassed, lambda: (fm.dataset(KEYS),), {"class_weights": {}},
                                   r"fit takes no argument 'class_weights'; did you mean 'class_weight'\?"),
    "no_labels": (fm.ranking_tf_keras, lambda: (fm.dataset(KEYS).map(lambda x, y: x),), {},
                  r"element_spec .*train_step"),
}


def _state(model):
    if not isinstance(model, (keras.Model, tf_keras.Model)):
        return None
    weights = [w.copy() for w in model.get_weights()]
    return weights, model.train_function, dict(vars(model)).get("train_step")


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_anything_changes(case):
    factory, arguments, kwargs, message = CASES[case]
    model = factory()
    before = _state(model)
    with pytest.raises(SplitError, match=message):
        sst.fit(model, *arguments(), epochs=1, verbose=0, **kwargs)
    after = _state(model)
    if before is not None:
        assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0])) and before[1:] == after[1:]
        assert "train_step" not in vars(model) and model.train_function is None


def test_a_missing_feature_is_refused():
    model = fm.ranking_tf_keras()
    with pytest.raises(SplitError, match=r"ranking\.train_step does not trace .*KeyError: 'item'.*every feature"):
        sst.fit(model, fm.dataset(("user",)), epochs=1, verbose=0)
    assert model.train_function is None and "train_step" not in vars(model)


def test_a_failed_validation_split_changes_nothing():
    model = fm.ranking_tf_keras()
    bad_validation = fm.dataset(("user",))
    with pytest.raises(SplitError, match=r"ranking\.test_step does not trace"):
        sst.fit(model, fm.dataset(KEYS), validation_data=bad_validation, epochs=1, verbose=0)
    assert model.train_function is None and "train_step" not in vars(model) and "test_step" not in vars(model)
    assert model.optimizer.iterations.numpy() == 0                       # nothing trained


def test_a_functional_model_that_does_not_build_for_the_dataset():
    from tests.tf2.keras_models import preprocessing_model, raw_dataset

    model = preprocessing_model()
    without_city = raw_dataset().map(lambda x, y: ({k: v for k, v in x.items() if k != "city"}, y))
    with pytest.raises(SplitError, match=r"'ranker' does not build for the dataset's element_spec .*every input"):
        sst.fit(model, without_city, epochs=1, verbose=0)
    assert model.train_function is None and model.optimizer.iterations.numpy() == 0


def test_a_layer_split_of_a_subclassed_model_points_at_fit():
    with pytest.raises(SplitError, match=r"split_model\(\): 'keras3_ranker' is a subclassed model \(Keras3Ranker\).*"
                                         r"ss\.tf2\.fit\(model, dataset\) trains it"):
        sst.split_model(fm.keras3_subclassed())
    with pytest.raises(SplitError, match=r"Ranking is not a Keras 3 model.*ss\.tf2\.fit\(model, dataset\) trains any"):
        sst.split_model(fm.ranking_tf_keras())
