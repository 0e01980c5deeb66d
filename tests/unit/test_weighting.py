"""Class weights as Keras's fit reads them, and as a run's spec takes them."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights
from pydantic import ValidationError
from sklearn.utils.class_weight import compute_class_weight

from slsml.spec.config import TrainingSpec
from slsml.training import weighting

LABELS = {
    "class ids": np.array([0, 2, 1, 2, 3, 0]),
    "a column": np.array([[1], [0], [1], [1]]),
    "binary floats": np.array([0.0, 1.0, 1.0, 0.0], dtype=np.float32),
    "one-hot": np.eye(4, dtype=np.float32)[[3, 1, 0, 1, 2]],
}


@pytest.mark.parametrize("labels", list(LABELS))
def test_sample_weights_from_classes_equal_keras(labels: str) -> None:
    y, class_weight = LABELS[labels], {0: 0.5, 1: 3.0, 3: 7.0}  # class 2 left out: 1, as Keras
    table = [class_weight.get(c, 1.0) for c in range(4)]
    expected = class_weight_to_sample_weights(keras.ops.convert_to_tensor(y), class_weight)
    got = weighting.of_classes(y, table)
    assert len(set(got.tolist())) > 1
    np.testing.assert_array_equal(got, expected)


def test_balanced_weights_equal_scikit_learns() -> None:
    y = np.array([0, 0, 0, 1, 2, 2, 4, 4, 4, 4])  # class 3: no samples
    counts = np.bincount(y)
    got = weighting.resolve("balanced", tuple(counts), len(counts))
    present = np.unique(y)
    expected = compute_class_weight("balanced", classes=present, y=y)
    assert [got[c] for c in present] == pytest.approx(expected.tolist(), rel=1e-12)
    assert got[3] == 1.0


def test_a_mapping_naming_a_class_the_labels_do_not_have_is_refused_by_name() -> None:
    with pytest.raises(
        ValueError,
        match=r"^class_weight names classes 3, 9 that the labels do not have \(the"
        r" training labels are classes 0, 1, 2, 4\)$",
    ):
        weighting.resolve({0: 2.0, 3: 1.0, 9: 1.0}, (5, 1, 2, 0, 1), 5)
    assert weighting.resolve({2: 4.0}, (5, 1, 2), 3) == (1.0, 1.0, 4.0)
    with pytest.raises(ValueError, match="balanced needs the samples of each class"):
        weighting.resolve("balanced", None, 4)
    with pytest.raises(ValueError, match="balanced needs the samples of each class"):
        weighting.resolve("balanced", None, None)


def test_float_labels_take_a_mapping_as_keras_each_label_rounded_to_its_class() -> None:
    y, class_weight = LABELS["binary floats"], {1: 5.0}
    table = weighting.resolve(class_weight, None, None)  # a dataset of float labels records no classes
    expected = class_weight_to_sample_weights(keras.ops.convert_to_tensor(y), class_weight)
    np.testing.assert_array_equal(weighting.of_classes(y, table), expected)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("heavy", "neither balanced nor a JSON mapping"),
        ('{"a": 1}', "class 'a' is not a class id"),
        ({-1: 2.0}, "class -1 is not a class id"),
        ({0: -1}, "the weight of class 0 must be a number from 0"),
        ("{}", "must be balanced or a mapping"),
    ],
)
def test_a_class_weight_that_is_not_one_is_refused_by_name(given: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainingSpec(class_weight=given)


def test_a_class_weight_is_kept_as_canonical_json_and_read_back() -> None:
    spec = TrainingSpec(class_weight='{"3": 1, "0": 2.5}')
    assert spec.class_weight == '{"0": 2.5, "3": 1.0}' == TrainingSpec(class_weight={3: 1.0, 0: 2.5}).class_weight
    assert spec.class_weights == {0: 2.5, 3: 1.0}
    assert TrainingSpec.model_validate_json(spec.model_dump_json()) == spec
