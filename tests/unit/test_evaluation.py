"""A split evaluated across workers: each worker's slice gives a state, the states' sum gives the result, equal
to single-process ``model.evaluate`` on the whole split for every metric kept here, at every worker count."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.spec.errors import BadInputError
from slsml.training import evaluation, modelio

SAMPLES = 202  # uneven slices for 3 and 7 workers
CLASSES = 5
M = keras.metrics


def _binary(rng: np.random.Generator) -> tuple[keras.Model, np.ndarray, np.ndarray, str]:
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")]
    )
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    return model, x, (x[:, 0] + 0.5 * rng.normal(size=SAMPLES) > 0).astype(np.int64), "binary_crossentropy"


def _sparse(rng: np.random.Generator) -> tuple[keras.Model, np.ndarray, np.ndarray, str]:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(CLASSES, activation="softmax")])
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    return model, x, rng.integers(0, CLASSES, SAMPLES), "sparse_categorical_crossentropy"


def _one_hot(rng: np.random.Generator) -> tuple[keras.Model, np.ndarray, np.ndarray, str]:
    model, x, y, _ = _sparse(rng)
    return model, x, np.eye(CLASSES, dtype=np.float32)[y], "categorical_crossentropy"


def _regression(rng: np.random.Generator) -> tuple[keras.Model, np.ndarray, np.ndarray, str]:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    return model, x, (x @ rng.normal(size=(6, 1)) + rng.normal(size=(SAMPLES, 1))).astype(np.float32), "mse"


CASES = {
    "binary": (_binary, lambda: [M.AUC(), M.Precision(), M.Recall(), "accuracy", M.MeanAbsoluteError()]),
    "sparse": (
        _sparse,
        lambda: [M.SparseTopKCategoricalAccuracy(k=2), "accuracy", M.MeanIoU(num_classes=CLASSES, sparse_y_pred=False)],
    ),
    "one-hot": (_one_hot, lambda: [M.F1Score(average="macro"), "accuracy", M.AUC(multi_label=True)]),
    "regression": (_regression, lambda: [M.R2Score(), M.MeanAbsoluteError(), "mse"]),
}


@pytest.mark.parametrize("workers", [1, 3, 7])
@pytest.mark.parametrize("case", CASES)
def test_states_summed_over_uneven_slices_equal_keras_evaluate(case: str, workers: int) -> None:
    build, metrics = CASES[case]
    keras.utils.set_random_seed(3)
    model, x, y, loss = build(np.random.default_rng(3))
    model.compile(loss=loss, metrics=metrics())
    expected = model.evaluate(x, y, return_dict=True, verbose=0)
    evaluator = evaluation.Evaluator(
        model, modelio.loss_config(model, None), modelio.metrics_config(model, True), (x[:2], y[:2])
    )
    slices = [evaluation.slice_of(SAMPLES, workers, w) for w in range(workers)]
    assert len({len(s) for s in slices}) == (1 if workers == 1 else 2)
    states = [evaluator.state(x[s], y[s]) for s in slices]
    got = evaluator.result(states)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    # each metric's state adds up: a state of a part is not the whole's (nothing is counted twice or kept last)
    if workers > 1:
        assert not np.allclose(states[0], evaluator.state(x, y))


@keras.saving.register_keras_serializable("slsml_tests")
class LargestError(keras.metrics.Metric):
    """The largest absolute error seen: a state that does not add up."""

    def __init__(self, name: str = "largest_error", **kwargs: object) -> None:
        super().__init__(name=name, **kwargs)
        self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

    def update_state(self, y_true, y_pred, sample_weight=None) -> None:
        error = keras.ops.max(keras.ops.abs(keras.ops.cast(y_true, "float32") - keras.ops.squeeze(y_pred, -1)))
        self.largest.assign(keras.ops.maximum(self.largest, error))

    def result(self):
        return self.largest


def test_a_metric_whose_state_does_not_add_up_is_refused_by_name() -> None:
    keras.utils.set_random_seed(3)
    model, x, y, loss = _regression(np.random.default_rng(3))
    model.compile(loss=loss, metrics=[M.MeanAbsoluteError(), LargestError()])
    with pytest.raises(BadInputError, match=r"metric largest_error \(LargestError\) cannot be computed across"):
        evaluation.check_mergeable(
            model, modelio.loss_config(model, None), modelio.metrics_config(model, True), x[:64], y[:64]
        )
    model.compile(loss=loss, metrics=[M.MeanAbsoluteError(), M.R2Score()])
    evaluation.check_mergeable(
        model, modelio.loss_config(model, None), modelio.metrics_config(model, True), x[:64], y[:64]
    )


def test_states_of_another_model_are_refused() -> None:
    model, x, y, loss = _binary(np.random.default_rng(0))
    model.compile(loss=loss, metrics=[M.AUC()])
    evaluator = evaluation.Evaluator(model, json.dumps(loss), json.dumps(["accuracy"]), (x[:2], y[:2]))
    with pytest.raises(ValueError, match="evaluation states of 5 values where this model's have 4"):
        evaluator.result([np.ones(5)])
    with pytest.raises(ValueError, match="no samples were evaluated"):
        evaluator.result([np.zeros(4)])


@pytest.mark.parametrize("case", ["binary", "regression"])
def test_weighted_states_equal_keras_evaluate_with_sample_weights(case: str) -> None:
    build, metrics = CASES[case]
    keras.utils.set_random_seed(4)
    rng = np.random.default_rng(4)
    model, x, y, loss = build(rng)
    w = rng.uniform(0.0, 3.0, SAMPLES).astype(np.float32)
    model.compile(loss=loss, metrics=metrics())
    expected = model.evaluate(x, y, sample_weight=w, return_dict=True, verbose=0)
    evaluator = evaluation.Evaluator(
        model, modelio.loss_config(model, None), modelio.metrics_config(model, True), (x[:2], y[:2])
    )
    slices = [evaluation.slice_of(SAMPLES, 3, worker) for worker in range(3)]
    got = evaluator.result(evaluator.state(x[s], y[s], w[s]) for s in slices)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    assert got["loss"] != pytest.approx(evaluator.result([evaluator.state(x, y)])["loss"], rel=1e-3)  # w counts


@pytest.mark.parametrize("weighted", [False, True])
def test_a_slice_evaluated_in_batches_of_any_size_equals_keras_evaluate(weighted: bool) -> None:
    """Batches of 64 and a last one of 10 (a traced step for each size), a regularized layer's penalty in the loss."""
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.05)),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    y = rng.integers(0, CLASSES, SAMPLES)
    w = rng.uniform(0.0, 3.0, SAMPLES).astype(np.float32) if weighted else None
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy", M.SparseTopKCategoricalAccuracy(k=2)])
    expected = model.evaluate(x, y, sample_weight=w, batch_size=64, return_dict=True, verbose=0)
    evaluator = evaluation.Evaluator(
        model, modelio.loss_config(model, None), modelio.metrics_config(model, True), (x[:2], y[:2])
    )
    got = evaluator.result([evaluator.state(x, y, w, batch=64)])
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    unregularized = keras.losses.sparse_categorical_crossentropy(y, model(x)).numpy()
    assert got["loss"] > np.average(unregularized, weights=w) + 1e-3  # the penalty counts


@pytest.mark.parametrize("workers", [1, 3, 7])
@pytest.mark.parametrize("count", [0, 5, SAMPLES, 10_000])
def test_the_workers_slices_partition_the_split(count: int, workers: int) -> None:
    """Every sample in exactly one worker's slice, in order, each slice of ⌊n/W⌋ or ⌈n/W⌉ samples."""
    slices = [evaluation.slice_of(count, workers, worker) for worker in range(workers)]
    assert np.array_equal(np.concatenate(slices), np.arange(count))
    assert {len(s) for s in slices} <= {count // workers, -(-count // workers)}


def test_each_outputs_train_loss_counts_a_batchs_samples_whatever_sizes_came_before() -> None:
    """A model of two outputs: a batch's state after one of another size (a worker slot's uneven slices) is its state
    alone, each output's loss counted by the batch's samples."""
    keras.utils.set_random_seed(6)
    rng = np.random.default_rng(6)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = [
        keras.layers.Dense(CLASSES, activation="softmax", name="digit")(hidden),
        keras.layers.Dense(1, name="size")(hidden),
    ]
    model = keras.Model(inputs, outputs)
    model.compile(loss={"digit": "sparse_categorical_crossentropy", "size": "mse"}, metrics={"size": ["mae"]})
    x = rng.normal(size=(22, 6)).astype(np.float32)
    y = {"digit": rng.integers(0, CLASSES, 22), "size": rng.normal(size=(22, 1)).astype(np.float32)}

    def batch(n: int) -> tuple[dict[str, np.ndarray], object]:
        return {k: v[:n] for k, v in y.items()}, model(x[:n], training=False)

    config = (modelio.loss_config(model, None), modelio.metrics_config(model, False))
    alone = evaluation.Evaluator(model, *config, (x[:2], {k: v[:2] for k, v in y.items()})).batch_state(
        *batch(21), None, 1.0
    )
    evaluator = evaluation.Evaluator(model, *config, (x[:2], {k: v[:2] for k, v in y.items()}))
    evaluator.batch_state(*batch(22), None, 1.0)
    after = evaluator.batch_state(*batch(21), None, 1.0)
    assert after[3] == alone[3] == 21  # digit_loss's count
    np.testing.assert_allclose(after, alone, rtol=1e-6)


def test_a_model_of_string_inputs_is_evaluated_as_keras_evaluates_it() -> None:
    """Metrics are built on a prediction found symbolically where the inputs are numbers; strings take a forward
    pass."""
    keras.utils.set_random_seed(0)
    text = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(text)
    logits = keras.layers.Dense(2)(keras.layers.CategoryEncoding(5)(ids))
    model = keras.Model(text, logits)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x, y = np.array([["a"], ["b"], ["c"], ["a"]]), np.array([0, 1, 1, 0])
    loss = modelio.loss_config(model, None)
    evaluator = evaluation.Evaluator(model, loss, modelio.metrics_config(model, True), (x[:2], y[:2]))
    figures = evaluator.result([evaluator.state(x, y)])
    expected = model.evaluate(tf.constant(x), y, verbose=0, return_dict=True)
    assert figures["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert figures["accuracy"] == pytest.approx(expected["accuracy"])
