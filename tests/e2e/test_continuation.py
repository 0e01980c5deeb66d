"""A round longer than its Worker's lifetime: with the Worker's timeout below the time a round keeps for handing
on (``slsml.training.progress.PAUSE_RESERVE_S``), each invocation takes one local step, stores the round's progress
and hands the round on to a fresh invocation of the same attempt. The run ends bit-identical to the same run whose
rounds each ran in one invocation, also with every message delivered twice, and the watchdog waits for the rounds
that go on rather than re-launching them."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.accounting import prices, usage
from slsml.client import demo, runs
from slsml.cost.modelinfo import from_keras_file
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.predict import predict
from slsml.cost.workload import function_timeouts, run_workload
from slsml.local.faults import Faults, SlowWorker
from slsml.rounds import accumulate
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.training import modelio, progress

from .conftest import final_weights, finish, log_entries, timeouts, train

pytestmark = pytest.mark.usefixtures("warm")  # the Worker times out after seconds here
REFERENCE = "continued-reference"
TIMEOUT_S = 2  # the Worker's (and Reducer's), for this test: below the reserve, so one step an invocation
LOCAL_STEPS = 12
SPEC = TrainingSpec(
    workers=2,
    reducers=2,
    global_batch=64,
    iterations=2,
    eval_every=0,
    algorithm="average",
    local_steps=LOCAL_STEPS,
    local_learning_rate=0.05,
    local_momentum=0.9,
    local_state="keep",
    deadline_s=TIMEOUT_S,  # the shortest the timeout allows: a round of twelve invocations outlasts it
)
assert TIMEOUT_S < progress.PAUSE_RESERVE_S
# worker 0's every invocation starts this late: its rounds of twelve invocations outlast the deadline however fast
# a step is, so that the deadline comes while they go on
SLOW_STEPS = Faults(slow_worker=SlowWorker(worker=0, seconds=0.25))
assert LOCAL_STEPS * SLOW_STEPS.slow_worker.seconds > SPEC.deadline_s


def _progress_keys(services, run_id: str) -> set[str]:
    stored = (key for i in range(SPEC.iterations) for key in services.store.list_keys(keys.iteration_prefix(run_id, i)))
    return {key for key in stored if "/progress/" in key}


@pytest.fixture(scope="module")
def uninterrupted(services, digits) -> np.ndarray:
    """The run with its rounds in one invocation each (the deployment's timeouts and a deadline to match)."""
    train(services, SPEC.model_copy(update={"deadline_s": 120.0}), REFERENCE)
    run = finish(services, REFERENCE)
    assert run.status == "COMPLETED", run.reason
    assert not _progress_keys(services, REFERENCE)
    return final_weights(services, REFERENCE)[0]


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice-placed"])
def test_a_round_past_the_workers_timeout_goes_on_in_fresh_invocations_and_ends_bit_identical(
    local, services, uninterrupted, twice
):
    """Twice: every message delivered twice, and objects placed beforehand at every key of the progress and slot
    state the rounds store (``slsml.pipeline.signed``): each is replaced by the worker's own."""
    run_id = f"continued-{'twice' if twice else 'once'}"
    placed = {
        keys.progress(run_id, i, w, 0, steps)
        for i in range(SPEC.iterations)
        for w in range(SPEC.workers)
        for steps in range(1, LOCAL_STEPS)
    } | {keys.local_state(run_id, i, w) for i in range(SPEC.iterations) for w in range(SPEC.workers)}
    for key in placed if twice else ():
        services.store.put_new(key, b"not the pipeline's")
    local.host.duplicate_deliveries = twice
    local.host.faults = SLOW_STEPS
    try:
        with timeouts(local, TIMEOUT_S):
            train(services, SPEC, run_id)
            run = finish(services, run_id)
    finally:
        local.host.duplicate_deliveries, local.host.faults = False, None
    assert run.status == "COMPLETED", run.reason
    assert final_weights(services, run_id)[0].tobytes() == uninterrupted.tobytes()
    # every round went on from each of its steps but the last, one invocation a step, duplicates or not
    assert _progress_keys(services, run_id) == {
        keys.progress(run_id, i, w, 0, steps)
        for i in range(SPEC.iterations)
        for w in range(SPEC.workers)
        for steps in range(1, LOCAL_STEPS)
    }
    # the deadlines that came while rounds went on waited for them: no worker was re-launched
    assert not any(record.relaunched for record in services.table.list_iterations(run_id))
    waited = log_entries(local.log_dir / "watchdog.log", message="deadline: rounds go on in fresh invocations")
    assert any(entry.get("run_id") == run_id for entry in waited)
    replaced = log_entries(local.log_dir / "worker.log", message="an object not written by its step was replaced")
    assert {entry["key"] for entry in replaced if f"/{run_id}/" in entry["key"]} == (placed if twice else set())


def test_the_plan_counts_the_requests_of_continued_rounds(local, services, tmp_path) -> None:
    """The plan of the same Worker timeout hands each round on after every step, as the run does, and its requests
    per iteration are the run's median iteration's, operation by operation (the deadline as long as the default,
    so that no watchdog turn falls in an iteration)."""
    run_id, steps = "continued-plan", 4
    spec = SPEC.model_copy(update={"iterations": 9, "local_steps": steps, "deadline_s": 120.0})
    with timeouts(local, TIMEOUT_S):
        train(services, spec, run_id)
        run = finish(services, run_id)
    assert run.status == "COMPLETED", run.reason
    assert local.host.wait_idle(run_id, 60)
    summary = runs.summarize(run, services.table.list_iterations(run_id), 0.0, usage.read_local(local.log_dir, run_id))
    path = tmp_path / "cnn.keras"
    path.write_bytes(modelio.save_model(demo.digits_cnn(seed=1)))
    figures = from_keras_file(path, batch=32, measure=False, parameters=Parameters())
    figures = {**figures, "compute_per_sample_s": 1e-4, "compute_source": "a step well within the timeout"}
    work = run_workload(figures, spec).at(timeout_s={**function_timeouts(), "worker": TIMEOUT_S})
    plan = predict(work, Parameters(), Quotas(), prices.PriceTable())
    assert (plan.continuations.invocations, plan.continuations.micro_batches_per_invocation) == (steps, 1)
    assert plan.requests_per_iteration == summary.requests_per_iteration


GRADIENT = TrainingSpec(
    workers=2, reducers=2, global_batch=64, iterations=2, eval_every=0, micro_batch=9, deadline_s=TIMEOUT_S
)
GRADIENT_MICRO_BATCHES = len(accumulate.sizes(GRADIENT.global_batch // GRADIENT.workers, 9))  # 32: 8, 8, 8, 8


def test_a_gradient_round_past_the_workers_timeout_goes_on_between_micro_batches_and_ends_bit_identical(
    local, services
) -> None:
    """Gradient averaging whose every micro-batch takes an invocation of its own (the slow worker's too): the
    progress each hands on is the micro-batches' sum so far, and the run ends bit-identical to the same run in one
    invocation a round."""
    train(services, GRADIENT.model_copy(update={"deadline_s": 120.0}), "gradient-whole")
    assert finish(services, "gradient-whole").status == "COMPLETED"
    local.host.faults = SLOW_STEPS
    try:
        with timeouts(local, TIMEOUT_S):
            train(services, GRADIENT, "gradient-continued")
            run = finish(services, "gradient-continued")
    finally:
        local.host.faults = None
    assert run.status == "COMPLETED", run.reason
    whole, continued = final_weights(services, "gradient-whole")[0], final_weights(services, "gradient-continued")[0]
    assert continued.tobytes() == whole.tobytes()
    assert _progress_keys(services, "gradient-continued") == {
        keys.progress("gradient-continued", i, w, 0, done)
        for i in range(GRADIENT.iterations)
        for w in range(GRADIENT.workers)
        for done in range(1, GRADIENT_MICRO_BATCHES)
    }
    assert not _progress_keys(services, "gradient-whole")
