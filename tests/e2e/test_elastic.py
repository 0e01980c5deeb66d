"""An elastic fleet: a run scaled while it trains launches each iteration with the workers set when it is
launched, and, since the global batch and the data order do not depend on the workers, ends with the weights
of the run that kept its workers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from slsml.client import runs
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError, SlsmlError

from .conftest import final_weights, finish, train

ITERATIONS, BATCH = 9, 96
SGD = OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9)
TOLERANCE = 1e-5  # × max|w|: the mean gradient summed from other slices


def _spec() -> TrainingSpec:
    return TrainingSpec(
        workers=4, reducers=2, global_batch=BATCH, iterations=ITERATIONS, eval_every=0, optimizer=SGD, max_workers=8
    )


def _when_at(services, run_id: str, iteration: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while (run := services.table.get_run(run_id)).iteration < iteration:
        assert run.status == "RUNNING", run.reason
        assert time.monotonic() < deadline, f"{run_id} did not reach iteration {iteration}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def scaled(services, digits):
    train(services, _spec(), "elastic-fixed")
    train(services, _spec(), "elastic-scaled")
    _when_at(services, "elastic-scaled", 2)
    runs.scale_run(services, "elastic-scaled", 8)
    _when_at(services, "elastic-scaled", 5)
    runs.scale_run(services, "elastic-scaled", 2)
    return {run_id: finish(services, run_id) for run_id in ("elastic-fixed", "elastic-scaled")}


def test_a_run_scaled_4_8_2_ends_with_the_weights_of_the_fixed_run(scaled, services):
    for run in scaled.values():
        assert run.status == "COMPLETED", run.reason
    fleet = [services.table.get_counter("elastic-scaled", i).workers for i in range(ITERATIONS)]
    print(f"\nworkers by iteration: {fleet}")
    assert fleet[0] == 4 and {8, 2} <= set(fleet) and fleet.index(8) < fleet.index(2), fleet
    assert fleet[-1] == 2
    reasons = {services.table.get_counter("elastic-scaled", i).workers_reason for i in range(ITERATIONS)}
    assert "run scale" in reasons
    got, _ = final_weights(services, "elastic-scaled")
    expected, _ = final_weights(services, "elastic-fixed")
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"elastic vs fixed W: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE
    samples = [
        sum(r.samples or 0 for r in services.table.get_iteration("elastic-scaled", i).reports.values())
        for i in range(ITERATIONS)
    ]
    assert samples == [BATCH] * ITERATIONS  # every iteration's slices cover its global batch


def test_scaling_outside_the_bounds_or_a_finished_run_is_refused_and_changes_nothing(scaled, services):
    before = services.table.get_run("elastic-scaled")
    with pytest.raises(SlsmlError, match="COMPLETED: only a RUNNING, STOPPED or FAILED run can be scaled"):
        runs.scale_run(services, "elastic-scaled", 4)
    train(services, _spec().model_copy(update={"iterations": 400}), "elastic-bounds")
    try:
        for workers in (0, 9):
            with pytest.raises(BadInputError, match=f"{workers} workers lie outside .* bounds of 1 to 8"):
                runs.scale_run(services, "elastic-bounds", workers)
        assert services.table.get_run("elastic-bounds").workers == 4
    finally:
        services.fail_run("elastic-bounds", "test over")
    assert services.table.get_run("elastic-scaled").workers == before.workers


def test_the_cost_tuner_walks_a_scaled_out_run_back_one_step_a_round(services, digits):
    """--workers auto --objective cost: scaled out to 8 by hand, the tuner takes the run back to its fewest
    workers, one ladder step per round, each change with its reason on the iteration's counter."""
    spec = TrainingSpec(
        workers="auto",
        min_workers=2,
        max_workers=8,
        objective="cost",
        reducers=2,
        global_batch=BATCH,
        iterations=18,
        eval_every=0,
        optimizer=SGD,
    )
    train(services, spec, "elastic-tuned")
    _when_at(services, "elastic-tuned", 1)
    runs.scale_run(services, "elastic-tuned", 8)
    run = finish(services, "elastic-tuned")
    assert run.status == "COMPLETED", run.reason
    counters = [services.table.get_counter("elastic-tuned", i) for i in range(18)]
    fleet = [c.workers for c in counters]
    print(f"\nworkers by iteration: {fleet}")
    assert fleet[0] == 2 and 8 in fleet and fleet[-1] == 2, fleet
    changes = runs.fleet(services.table.list_iterations("elastic-tuned"))  # as the summary shows them
    assert [c.workers for c in changes] == [2, 8, 6, 4, 3, 2], changes
    assert changes[0].reason is None and changes[1].reason == "run scale"
    assert all(c.reason.startswith("tuner (cost): $") for c in changes[2:]), [c.reason for c in changes]
