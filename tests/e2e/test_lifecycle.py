"""A run stopped for longer than the scratch expiry and the table's TTL still resumes: the local cloud applies the
bucket's lifecycle rules and the table's TTL (``slsml.local.lifecycle``) 8 and then 15 days ahead, as S3 and
DynamoDB would have by then. What the stopped run resumes from (weights, optimizer shards, slot states,
residuals) and its iteration history are still there, and it completes with the weights of an undisturbed run;
the transient scratch of its finished iterations is gone, and so is every carried object once it completed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from slsml.client import runs
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.deployment import DAY_S, SCRATCH_EXPIRY_DAYS

from .conftest import final_weights, finish, train

ITERATIONS = 6
STOP_AT = 2  # the run is stopped once it has merged this many iterations
CASES = {
    # gradient averaging with Adam: moments and step count live in the shards
    "adam": TrainingSpec(
        workers=2,
        reducers=2,
        global_batch=64,
        iterations=ITERATIONS,
        eval_every=0,
        optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
    ),
    # model averaging whose slots keep their local optimizer's state, with top-k updates and their residuals
    "average-keep-topk": TrainingSpec(
        workers=2,
        reducers=2,
        global_batch=64,
        iterations=ITERATIONS,
        eval_every=0,
        algorithm="average",
        local_steps=2,
        local_state="keep",
        local_momentum=0.9,
        compress="topk:0.05",
    ),
}


def _scratch(services: Services, run_id: str) -> tuple[list[str], list[str]]:
    """The run's objects under ``iters/``: (transient, carried)."""
    found = services.store.list_keys(f"{keys.run_prefix(run_id)}iters/")
    return [k for k in found if keys.is_transient(k)], [k for k in found if not keys.is_transient(k)]


@pytest.fixture(scope="module")
def stopped_for_two_weeks(local, services, digits) -> dict[str, int]:
    """Every case twice, ``<case>-whole`` undisturbed and ``<case>-stopped`` stopped after STOP_AT iterations; once
    the undisturbed runs completed, the lifecycle rules and the TTL are applied 8 days ahead, then 15: → the
    iteration each stopped run stands at."""
    for name, spec in CASES.items():
        train(services, spec, f"{name}-whole")
        train(services, spec, f"{name}-stopped")
    for name in CASES:
        while services.table.get_run(f"{name}-stopped").iteration < STOP_AT:
            time.sleep(0.05)
        assert services.stop_run(f"{name}-stopped")
    stood_at = {}
    for name in CASES:
        assert finish(services, f"{name}-whole").status == "COMPLETED"
        assert local.host.wait_idle(f"{name}-stopped", timeout_s=60)  # its in-flight work drains
        run = services.table.get_run(f"{name}-stopped")
        assert (run.status, runs.last_complete_model(services, run.run_id)) == ("STOPPED", run.iteration)
        stood_at[name] = run.iteration
        transient, _ = _scratch(services, run.run_id)
        assert keys.update(run.run_id, 0, 0) in transient  # there is transient scratch to expire
    now = time.time()
    expired = local.expire(now + (SCRATCH_EXPIRY_DAYS + 1) * DAY_S)
    assert expired.objects and all(keys.is_transient(key) for key in expired.objects)
    local.expire(now + 15 * DAY_S)  # past the TTL the run's items had before
    return stood_at


@pytest.mark.parametrize("name", list(CASES))
def test_a_run_stopped_past_the_scratch_expiry_and_the_ttl_resumes_bit_identically(
    stopped_for_two_weeks, local, services, name
) -> None:
    run_id, at = f"{name}-stopped", stopped_for_two_weeks[name]
    assert STOP_AT <= at < ITERATIONS - 1, "the run was not stopped mid-way: nothing to resume"
    transient, carried = _scratch(services, run_id)
    finished = [k for k in transient if int(k.split("/iters/")[1][:6]) < at]
    assert finished == [], "the transient scratch of finished iterations outlived the expiry"
    spec = CASES[name]
    kinds = {"slot_state": spec.local_state == "keep", "residuals": spec.compression.lossy}
    entering = keys.carried(run_id, at, spec.reducers, spec.initial_workers, **kinds)
    assert len(entering) > 1 + spec.reducers or name == "adam"  # the slots' states and residuals among them
    assert set(entering) <= set(carried), "what the stopped run resumes from expired"
    superseded = keys.carried(run_id, at - 2, spec.reducers, spec.initial_workers, **kinds)
    assert not set(superseded) & set(carried), "superseded carried state was kept"
    history = services.table.list_iterations(run_id)
    assert [r.iteration for r in history][:at] == list(range(at)), "the run's iteration history expired"
    assert all(r.merged_at is not None and r.train_loss is not None for r in history[:at])

    assert runs.resume_run(services, run_id).generation == 1
    run = finish(services, run_id)
    assert (run.status, run.iteration, run.generation) == ("COMPLETED", ITERATIONS, 1), run.reason
    expected, got = final_weights(services, f"{name}-whole")[0], final_weights(services, run_id)[0]
    assert np.array_equal(got, expected), f"max|Δw| = {np.abs(got - expected).max():.2e}"
    assert local.host.wait_idle(run_id, timeout_s=60)
    assert _scratch(services, run_id)[1] == [], "carried state outlived its completed run"
    assert _scratch(services, f"{name}-whole")[1] == [], "carried state outlived its completed run"
