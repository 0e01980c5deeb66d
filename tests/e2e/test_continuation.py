"""A round longer than its Worker's lifetime: with the Worker's timeout below the time a round keeps for handing
on (``slsml.training.progress.PAUSE_RESERVE_S``), each invocation takes one local step, stores the round's progress
and hands the round on to a fresh invocation of the same attempt. The run ends bit-identical to the same run whose
rounds each ran in one invocation, also with every message delivered twice, and the watchdog waits for the rounds
that go on rather than re-launching them."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.training import progress

from .conftest import final_weights, finish, log_entries, timeouts, train

pytestmark = pytest.mark.usefixtures("warm")  # the Worker times out after seconds here
REFERENCE = "continued-reference"
TIMEOUT_S = 2  # the Worker's (and Reducer's), for this test: below the reserve, so one step an invocation
LOCAL_STEPS = 8
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
    deadline_s=TIMEOUT_S,  # the shortest the timeout allows: a round of eight invocations outlasts it
)
assert TIMEOUT_S < progress.PAUSE_RESERVE_S


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


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
def test_a_round_past_the_workers_timeout_goes_on_in_fresh_invocations_and_ends_bit_identical(
    local, services, uninterrupted, twice
):
    run_id = f"continued-{'twice' if twice else 'once'}"
    local.host.duplicate_deliveries = twice
    try:
        with timeouts(local, TIMEOUT_S):
            train(services, SPEC, run_id)
            run = finish(services, run_id)
    finally:
        local.host.duplicate_deliveries = False
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
