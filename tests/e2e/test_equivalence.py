"""With quorum 1 the pipeline reproduces single-process Keras training on the same global batches."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml import data, demo, modelio
from slsml.config import OptimizerConfig, TrainingSpec

from .conftest import final_weights, finish, train

ITERATIONS = 3
BATCH = 96
OPTIMIZERS = {
    "sgd-momentum": OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9),
    "sgd-nesterov": OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9, nesterov=True),
    "adam": OptimizerConfig(name="adam", learning_rate=3e-3),
}
# SGD: float32 round-off of a different summation order (worker means, then a weighted mean).
# Adam: m/(sqrt(v)+eps) turns relative errors of ~1e-7 in g into larger absolute steps where v is
# tiny (a gradient near 0 gives a step of ±lr whatever its size), so a looser bound, 1e-4.
TOLERANCE = {"sgd-momentum": 1e-5, "sgd-nesterov": 1e-5, "adam": 1e-4}
SHAPES = [(w, r) for w, r in itertools.product((1, 3, 4), (1, 2, 3))]
CASES = [(name, w, r) for name in ("sgd-momentum", "adam") for w, r in SHAPES] + [("sgd-nesterov", 3, 2)]


def _run_id(name: str, workers: int, reducers: int) -> str:
    return f"eq-{name}-w{workers}-r{reducers}"


@pytest.fixture(scope="module")
def pipeline_runs(services, digits):
    """All cases at once through the shared pipeline (runs also must not disturb each other)."""
    for name, workers, reducers in CASES:
        spec = TrainingSpec(workers=workers, reducers=reducers, global_batch=BATCH, iterations=ITERATIONS,
                            optimizer=OPTIMIZERS[name], eval_every=0)
        train(services, spec, _run_id(name, workers, reducers))
    return {case: finish(services, _run_id(*case)) for case in CASES}


def reference_weights(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Single-process Keras: the same model, global batches, loss and optimizer."""
    model = demo.digits_cnn(seed=1)
    config = OPTIMIZERS[name]
    if config.name == "sgd":
        optimizer = keras.optimizers.SGD(config.learning_rate, momentum=config.momentum, nesterov=config.nesterov)
    else:
        optimizer = keras.optimizers.Adam(config.learning_rate)
    loss_fn = modelio.deserialize_loss(modelio.loss_config(model, None))
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[batch], model(x[batch], training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_weights), model.trainable_weights,
                                      strict=True))
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


@pytest.mark.parametrize(("name", "workers", "reducers"), CASES)
def test_pipeline_matches_single_process_keras(pipeline_runs, services, digits, name, workers, reducers):
    run = pipeline_runs[(name, workers, reducers)]
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == ITERATIONS
    got, _ = final_weights(services, run.run_id)
    expected = reference_weights(name, digits[0], digits[1])
    initial = np.concatenate([np.asarray(w).ravel() for w in demo.digits_cnn(seed=1).get_weights()])
    assert np.abs(expected - initial).max() > 100 * TOLERANCE[name] * np.abs(expected).max(), "training moved nothing"
    error = np.abs(got - expected).max() / np.abs(expected).max()
    assert error <= TOLERANCE[name], f"{name} W={workers} R={reducers}: max|Δw|/max|w| = {error:.2e}"
