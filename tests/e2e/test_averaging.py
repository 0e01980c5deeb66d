"""Model averaging through the pipeline equals its definition in TensorFlow: with one worker, N rounds of K
local SGD steps are N·K steps of single-process SGD on the same global batches; with three, each round is
every worker's K local steps from the round's model, averaged by samples; and with K=1, a local SGD rate of 1
and the run's optimizer on the server, model averaging is gradient averaging."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.client import demo
from slsml.data import datasets as data
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio

from .conftest import final_weights, finish, train

ROUNDS, LOCAL_STEPS, BATCH, LOCAL_RATE = 3, 3, 96, 0.05
TOLERANCE = 1e-5  # × max|w|: float32 round-off of the weight changes and their average
SERVER = OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9)


def _averaging(workers: int, reducers: int, **options) -> TrainingSpec:
    fields = {"algorithm": "average", "local_steps": LOCAL_STEPS, "local_learning_rate": LOCAL_RATE, **options}
    return TrainingSpec(
        workers=workers,
        reducers=reducers,
        global_batch=BATCH,
        iterations=ROUNDS,
        eval_every=0,
        optimizer=SERVER,
        **fields,
    )


RUNS = {
    "avg-w1": _averaging(1, 2),
    "avg-w3": _averaging(3, 3),
    "avg-w3-keep": _averaging(3, 2, local_momentum=0.9, local_state="keep"),
    "avg-k1-server": _averaging(3, 2, local_steps=1, local_learning_rate=1.0, server="optimizer"),
    "grad-w3": TrainingSpec(
        workers=3, reducers=2, global_batch=BATCH, iterations=ROUNDS, eval_every=0, optimizer=SERVER
    ),
}


@pytest.fixture(scope="module")
def finished(services, digits):
    for run_id, spec in RUNS.items():
        train(services, spec, run_id)
    return {run_id: finish(services, run_id) for run_id in RUNS}


def _flat(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


def _local_steps(
    model: keras.Model,
    start: list[np.ndarray],
    batches: list[np.ndarray],
    x,
    y,
    optimizer: keras.optimizers.Optimizer | None = None,
) -> list[np.ndarray]:
    """K steps of Keras SGD (default: plain, at the local rate) from ``start``, one per batch; the trainable
    weights' change."""
    model.set_weights(start)
    optimizer = optimizer or keras.optimizers.SGD(learning_rate=LOCAL_RATE)
    loss_fn = modelio.deserialize_loss(modelio.loss_config(model, None))
    for batch in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(y[batch], model(x[batch], training=True))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_weights), model.trainable_weights, strict=True)
        )
    return [s - np.asarray(w) for s, w in zip(start, model.get_weights(), strict=True)]


def reference(workers: int, momentum: float = 0.0, keep: bool = True) -> np.ndarray:
    """Each round: every worker's local steps on its slices of the round's global batches, from the round's
    model; the changes averaged by samples and subtracted (FedAvg). With ``momentum``, each worker slot
    keeps one Keras SGD optimizer, and with it its momentum, from round to round (``keep``), or takes a
    new one every round."""
    x, y, _, _ = demo.digits()
    model = demo.digits_cnn(seed=1)
    weights = model.get_weights()
    slots = [
        keras.optimizers.SGD(learning_rate=LOCAL_RATE, momentum=momentum) if momentum else None for _ in range(workers)
    ]
    for round_number in range(ROUNDS):
        numbers = range(round_number * LOCAL_STEPS, (round_number + 1) * LOCAL_STEPS)
        batches = [data.global_batch_indices(len(x), BATCH, seed=0, iteration=n) for n in numbers]
        changes, samples = [], []
        if momentum and not keep:
            slots = [keras.optimizers.SGD(learning_rate=LOCAL_RATE, momentum=momentum) for _ in range(workers)]
        for worker in range(workers):
            slices = [data.worker_indices(b, workers, worker) for b in batches]
            changes.append(_local_steps(model, weights, slices, x, y, slots[worker]))
            samples.append(sum(len(s) for s in slices))
        total = sum(samples)
        weights = [
            w - sum(n * c[i] for n, c in zip(samples, changes, strict=True)) / total for i, w in enumerate(weights)
        ]
    model.set_weights(weights)
    return _flat(model)


def single_process_sgd() -> np.ndarray:
    """ROUNDS·LOCAL_STEPS steps of Keras SGD at the local rate, one per global batch."""
    x, y, _, _ = demo.digits()
    model = demo.digits_cnn(seed=1)
    batches = [data.global_batch_indices(len(x), BATCH, seed=0, iteration=n) for n in range(ROUNDS * LOCAL_STEPS)]
    _local_steps(model, model.get_weights(), batches, x, y)
    return _flat(model)


def _error(got: np.ndarray, expected: np.ndarray) -> float:
    initial = _flat(demo.digits_cnn(seed=1))
    scale = np.abs(expected).max()
    assert np.abs(expected - initial).max() > 100 * TOLERANCE * scale, "training moved nothing"
    return float(np.abs(got - expected).max() / scale)


def test_one_worker_is_single_process_sgd_over_every_local_step(finished, services):
    run = finished["avg-w1"]
    assert run.status == "COMPLETED", run.reason
    got, _ = final_weights(services, "avg-w1")
    expected = single_process_sgd()
    error = _error(got, expected)
    print(f"\nW=1 K={LOCAL_STEPS}: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE


def test_three_workers_average_their_local_changes(finished, services):
    run = finished["avg-w3"]
    assert run.status == "COMPLETED", run.reason
    got, _ = final_weights(services, "avg-w3")
    expected = reference(3)
    error = _error(got, expected)
    print(f"\nW=3 K={LOCAL_STEPS}: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE
    # averaging the changes is not training one model on the round's whole batches: the test can tell them apart
    assert np.abs(expected - single_process_sgd()).max() > 10 * TOLERANCE * np.abs(expected).max()


def test_local_momentum_kept_per_worker_slot_goes_on_from_round_to_round(finished, services):
    run = finished["avg-w3-keep"]
    assert run.status == "COMPLETED", run.reason
    got, _ = final_weights(services, "avg-w3-keep")
    expected = reference(3, momentum=0.9)
    error = _error(got, expected)
    print(f"\nW=3 K={LOCAL_STEPS}, momentum kept per slot: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE
    # momentum that started fresh every round would end elsewhere: the test can tell them apart
    reset = np.abs(expected - reference(3, momentum=0.9, keep=False)).max()
    assert reset > 10 * TOLERANCE * np.abs(expected).max()


def test_one_local_step_at_rate_one_with_the_server_optimizer_is_gradient_averaging(finished, services):
    for run_id in ("avg-k1-server", "grad-w3"):
        assert finished[run_id].status == "COMPLETED", finished[run_id].reason
    averaged, _ = final_weights(services, "avg-k1-server")
    gradient, _ = final_weights(services, "grad-w3")
    error = _error(averaged, gradient)
    print(f"\nK=1, local rate 1, server SGD momentum vs gradient averaging: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE
