"""Train metrics per iteration: the loss and compiled metrics over an iteration's global batch, from the states the
workers track on their batches' forward passes, summed and turned into results once, equal Keras's train step on
the same global batch with the same weights (``fit`` over that batch alone), sample-weighted as Keras weights them,
whatever the workers, and in pipeline stages, every stage's regularization in the loss; and ``slsml.fit``'s History
sums an epoch's iterations as ``fit`` aggregates its batches."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from slsml.client import demo
from slsml.client.fit import epoch_history
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.training import evaluation, modelio

from .conftest import finish

ITERATIONS = 4
BATCH = 96
DATASET = "digits-binary-weighted"
TOLERANCE = 1e-6
FIGURES = ("loss", "accuracy", "auc", "mean_absolute_error")
L2, STAGED = 0.05, "train-metrics-staged"  # a run in two stages, each layer's kernel regularized


def binary_model(l2: float | None = None) -> keras.Model:
    """A classifier of digits ≥ 5, compiled with accuracy, AUC and a regression metric (``l2``: each layer's kernel
    regularized by that factor)."""
    keras.utils.set_random_seed(3)
    regularizer = None if l2 is None else keras.regularizers.L2(l2)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
            keras.layers.Dense(1, activation="sigmoid", kernel_regularizer=regularizer),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.2),
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc"), "mean_absolute_error"],
    )
    return model


def binary_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as ≥ 5 or not, with per-sample weights."""
    x, y, x_test, y_test = demo.digits()
    weights = np.random.default_rng(4).uniform(0.0, 3.0, len(x)).astype(np.float32)
    return x, (y >= 5).astype(np.float32), x_test, (y_test >= 5).astype(np.float32), weights


def _run_id(workers: int) -> str:
    return f"train-metrics-w{workers}"


@pytest.fixture(scope="module")
def metric_runs(services) -> dict[int, str]:
    x, y, x_test, y_test, weights = binary_digits()
    data.put_dataset(services.store, DATASET, x, y, x_test, y_test, w=weights)
    spec = TrainingSpec(reducers=2, global_batch=BATCH, iterations=ITERATIONS, eval_every=0)
    model_bytes = modelio.save_model(binary_model())
    for workers in (1, 3):
        launch.start_run(services, model_bytes, DATASET, spec.model_copy(update={"workers": workers}), _run_id(workers))
    staged = spec.model_copy(update={"workers": 1, "pipeline_stages": 2, "micro_batch": BATCH // 2})
    launch.start_run(services, modelio.save_model(binary_model(L2)), DATASET, staged, STAGED)
    return {workers: _run_id(workers) for workers in (1, 3)}


def reference(weighted: bool = True, every: int = 1, l2: float | None = None) -> list[dict[str, float]]:
    """Keras's own ``fit`` of ``binary_model(l2)`` on the pipeline's global batches, ``every`` of them an epoch
    (``weighted``: with the samples' weights): each epoch's figures, over its batches."""
    x, y, _, _, weights = binary_digits()
    model = binary_model(l2)
    figures = []
    for first in range(0, ITERATIONS, every):
        batches = [data.global_batch_indices(len(x), BATCH, seed=0, iteration=i) for i in range(first, first + every)]
        epoch = np.concatenate(batches)
        history = model.fit(
            x[epoch],
            y[epoch],
            sample_weight=weights[epoch] if weighted else None,
            batch_size=BATCH,
            epochs=1,
            shuffle=False,
            verbose=0,
        ).history
        figures.append({name: float(values[0]) for name, values in history.items()})
    return figures


@pytest.mark.parametrize("workers", [1, 3])
def test_each_iterations_train_metrics_equal_keras_train_step_on_its_global_batch(metric_runs, services, workers):
    run = finish(services, metric_runs[workers], timeout_s=600)
    assert run.status == "COMPLETED", run.reason
    expected = reference()
    assert sorted(expected[0]) == sorted(FIGURES)
    # the figures move between iterations, and the weights change the loss, by far more than the tolerance
    assert max(abs(expected[-1][n] - expected[0][n]) for n in FIGURES) > 1000 * TOLERANCE
    assert abs(reference(weighted=False)[0]["loss"] - expected[0]["loss"]) > 1000 * TOLERANCE
    counters = [services.table.get_counter(run.run_id, i) for i in range(ITERATIONS)]
    error = max(abs(c.train[n] - e[n]) for c, e in zip(counters, expected, strict=True) for n in FIGURES if c.train)
    print(f"\ntrain metrics W={workers}: max |Δ| over {ITERATIONS} iterations = {error:.1e}")
    for iteration, (counter, keras_figures) in enumerate(zip(counters, expected, strict=True)):
        assert counter.train is not None, f"iteration {iteration} has no train figures"
        assert sorted(counter.train) == sorted(FIGURES)
        for name in FIGURES:
            assert counter.train[name] == pytest.approx(keras_figures[name], abs=TOLERANCE), (iteration, name)
        assert counter.train_loss == pytest.approx(keras_figures["loss"], abs=TOLERANCE)


def _train_figures(services, run_id: str) -> list[dict[str, float]]:
    run = finish(services, run_id, timeout_s=600)
    assert run.status == "COMPLETED", run.reason
    return [services.table.get_counter(run_id, i).train or {} for i in range(ITERATIONS)]


def test_a_run_in_stages_tracks_keras_train_figures_with_every_stages_regularization(metric_runs, services):
    """Each stage holds a regularized layer: the loss the stages' metrics track adds both regularizations, as Keras's
    train step does (the gradient of each already did)."""
    config = RunConfig.model_validate(services.store.get_json(keys.run_config(STAGED)))
    assert config.stage_blocks is not None and len(config.stage_blocks) == 2
    expected, found = reference(l2=L2), _train_figures(services, STAGED)
    # the regularization moves the loss by far more than the tolerance
    assert abs(expected[0]["loss"] - reference()[0]["loss"]) > 1000 * TOLERANCE
    for iteration, (figures, keras_figures) in enumerate(zip(found, expected, strict=True)):
        assert sorted(figures) == sorted(FIGURES), iteration
        for name in FIGURES:
            assert figures[name] == pytest.approx(keras_figures[name], abs=TOLERANCE), (iteration, name)


def test_an_epochs_history_sums_its_iterations_states_as_keras_aggregates_an_epochs_batches(metric_runs, services):
    """``slsml.fit``'s History of the same iterations taken as epochs of two: each epoch's figures, from its
    iterations' states summed, equal Keras's running figures at the end of those two batches."""
    run = finish(services, metric_runs[3], timeout_s=600)
    assert run.status == "COMPLETED", run.reason
    config = RunConfig.model_validate(services.store.get_json(keys.run_config(run.run_id)))
    x, y, _, _, _ = binary_digits()
    train = evaluation.Evaluator(binary_model(), config.loss, config.metrics, (x[:2], y[:2])).result
    history = epoch_history(services.table.list_iterations(run.run_id), 2, ITERATIONS // 2, "val", train)
    per_iteration, per_epoch = reference(), reference(every=2)
    assert sorted(history) == sorted(FIGURES)
    for epoch, expected in enumerate(per_epoch):
        # the epoch's figure is not its last iteration's: the comparison tells them apart
        assert abs(expected["auc"] - per_iteration[2 * epoch + 1]["auc"]) > 1000 * TOLERANCE
        for name in FIGURES:
            assert history[name][epoch] == pytest.approx(expected[name], abs=TOLERANCE), (epoch, name)


HUGE = 1e20  # a label whose squared error overflows float32: Keras's mse is Inf over a batch that holds it


def huge_label_model() -> keras.Model:
    """A linear regression trained on the absolute error (finite), with the squared error and R² as metrics."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mae", metrics=["mse", keras.metrics.R2Score()])
    return model


def test_a_participants_state_that_is_not_finite_gives_the_figures_keras_shows(services):
    """Iteration 0's global batch holds a label of 1e20, in one of the two workers' slices: that worker's mse and R²
    state is Inf, its update finite. Its figures come out as the sum gives them, as Keras's train step shows them on
    that batch (mse Inf, R² NaN, the loss finite), stored and read back through the run table; iteration 1's are
    finite."""
    rng = np.random.default_rng(5)
    x, coefficients = rng.normal(size=(72, 4)).astype(np.float32), rng.normal(size=(4, 1))
    y = (x @ coefficients).astype(np.float32)
    batches = [data.global_batch_indices(64, 32, seed=0, iteration=i) for i in range(2)]
    y[batches[0][0]] = HUGE
    data.put_dataset(services.store, "huge-label", x[:64], y[:64], x[64:], y[64:])
    spec = TrainingSpec(workers=2, reducers=1, global_batch=32, iterations=2, eval_every=0)
    launch.start_run(services, modelio.save_model(huge_label_model()), "huge-label", spec, "huge-label-metrics")
    run = finish(services, "huge-label-metrics")
    assert run.status == "COMPLETED", run.reason
    model, expected = huge_label_model(), []
    for batch in batches:  # Keras's train step on each global batch in turn
        history = model.fit(x[batch], y[batch], batch_size=32, epochs=1, shuffle=False, verbose=0).history
        expected.append({name: float(values[0]) for name, values in history.items()})
    assert math.isinf(expected[0]["mse"]) and math.isnan(expected[0]["r2_score"])
    assert math.isfinite(expected[0]["loss"]) and all(math.isfinite(v) for v in expected[1].values())
    for iteration, keras_figures in enumerate(expected):
        counter = services.table.get_counter(run.run_id, iteration)
        assert counter.train is not None, f"iteration {iteration} has no train figures"
        assert sorted(counter.train) == sorted(keras_figures)
        for name, value in keras_figures.items():
            assert counter.train[name] == pytest.approx(value, rel=1e-5, nan_ok=True), (iteration, name)
