"""A run stopped mid-way and resumed ends with the weights of an uninterrupted one, with an optimizer
whose learning rate follows a schedule and whose state (moments, step count) lives in the shards, and
across reducers that exchange sums of squares to clip by the global norm."""

from __future__ import annotations

import time

import numpy as np
import pytest

from slsml.client import runs
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.schedules import CosineDecay, ExponentialDecay

from .conftest import final_weights, finish, train

ITERATIONS = 6
STOP_AT = 2  # the run is stopped once it has merged this many iterations
OPTIMIZERS = {
    "adamw-cosine-warmup": OptimizerConfig(
        name="adamw",
        weight_decay=0.1,
        learning_rate=CosineDecay(initial_learning_rate=5e-4, decay_steps=4, warmup_target=4e-3, warmup_steps=2),
    ),
    "adam-exponential-globalclip": OptimizerConfig(
        name="adam",
        learning_rate=ExponentialDecay(initial_learning_rate=4e-3, decay_steps=1, decay_rate=0.7),
        global_clipnorm=0.2,
    ),
}


def _spec(name: str) -> TrainingSpec:
    return TrainingSpec(
        workers=2, reducers=3, global_batch=64, iterations=ITERATIONS, eval_every=0, optimizer=OPTIMIZERS[name]
    )


@pytest.fixture(scope="module")
def stopped_runs(services, digits) -> dict[str, int]:
    """Every case twice at once, as ``<case>-whole`` and ``<case>-resumed``; the latter stopped after
    STOP_AT iterations, left to drain, then resumed. → the iteration each resumed from."""
    for name in OPTIMIZERS:
        train(services, _spec(name), f"{name}-whole")
        train(services, _spec(name), f"{name}-resumed")
    resumed_from = {}
    for name in OPTIMIZERS:
        run_id = f"{name}-resumed"
        while services.table.get_run(run_id).iteration < STOP_AT:
            time.sleep(0.05)
        assert services.stop_run(run_id)
    time.sleep(2)  # in-flight work drains
    for name in OPTIMIZERS:
        run_id = f"{name}-resumed"
        assert services.table.get_run(run_id).status == "STOPPED"
        resumed_from[name] = runs.last_complete_model(services, run_id)
        assert runs.resume_run(services, run_id).generation == 1
    return resumed_from


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(stopped_runs, services, name):
    assert STOP_AT <= stopped_runs[name] < ITERATIONS - 1, "the run was not stopped mid-way: nothing to resume"
    whole, resumed = finish(services, f"{name}-whole"), finish(services, f"{name}-resumed")
    assert (whole.status, whole.iteration) == ("COMPLETED", ITERATIONS), whole.reason
    assert (resumed.status, resumed.iteration, resumed.generation) == ("COMPLETED", ITERATIONS, 1), resumed.reason
    expected, got = final_weights(services, whole.run_id)[0], final_weights(services, resumed.run_id)[0]
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(
        f"\n{name}: resumed from iteration {stopped_runs[name]}, max|Δw|/max|w| = {error:.2e}"
        f"{' (bit-identical)' if np.array_equal(got, expected) else ''}"
    )
    assert error <= 1e-6, f"{name}: max|Δw|/max|w| = {error:.2e}"
