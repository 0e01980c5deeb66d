"""Deadlines: the watchdog re-launches missing workers and reducers, fires a late barrier at its floor,
lets a shard keep its weights as a last resort, and fails a run whose workers never deliver."""

from __future__ import annotations

import re

import numpy as np
import pytest

from slsml.client import demo, runs
from slsml.local.faults import Delay, Faults
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio

from .conftest import final_weights, finish, timeouts, train, trained_clean
from .test_faults import injecting

pytestmark = pytest.mark.usefixtures("warm")  # the Worker and Reducer time out after seconds here
SPEC = TrainingSpec(
    workers=4,
    reducers=2,
    global_batch=128,
    iterations=3,
    eval_every=0,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
)


@pytest.fixture(scope="module")
def clean_weights(services, digits) -> np.ndarray:
    return trained_clean(services, SPEC, "deadline-clean")


def test_lost_deliveries_are_relaunched_and_the_result_is_unchanged(local, services, digits, clean_weights):
    """Messages held back for 4 s miss 2 s deadlines: the watchdog re-launches those workers and
    reducers with new attempts, the held-back attempts are ignored, and with a floor of 1 (wait for
    every worker) the weights are bit-identical to the clean run's."""
    spec = SPEC.model_copy(update={"deadline_s": 2.0, "deadline_floor": 1.0, "deadline_retries": 4})
    held_back = Faults(seed=11, sns_delay=Delay(probability=0.15, seconds=4))
    with timeouts(local, 2), injecting(local, held_back) as report:
        train(services, spec, "deadline-relaunch")
        run = finish(services, "deadline-relaunch")
    print(f"relaunch: {report}")
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, "deadline-relaunch")[0], clean_weights)
    iterations = services.table.list_iterations("deadline-relaunch")
    relaunched = sum(len(r.relaunched) for r in iterations)
    assert relaunched + sum(r.reduce_relaunches for r in iterations) > 0, iterations
    assert not any(r.stale_shards for r in iterations), [(r.iteration, r.stale_shards) for r in iterations]
    for record in iterations:  # each participant's report is of its latest attempt
        for participant in record.participants:
            assert participant.attempt >= record.relaunched.get(participant.worker, 0)


def test_a_shard_no_reducer_finishes_keeps_its_weights(local, services, digits):
    """Every reducer's reads take 6 s, past its 1 s timeout and two 1 s deadlines: both shards keep the initial
    weights and the run still completes, counting the stale shards."""
    spec = SPEC.model_copy(update={"iterations": 1, "deadline_s": 1.0, "deadline_retries": 1})
    model = demo.digits_cnn(seed=1)
    slow_reads = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=r"/updates/")
    with timeouts(local, 1), injecting(local, slow_reads):
        train(services, spec, "deadline-stale", modelio.save_model(model))
        run = finish(services, "deadline-stale")
    assert run.status == "COMPLETED", run.reason
    record = services.table.get_iteration("deadline-stale", 0)
    assert record.stale_shards == {0, 1} and record.reduce_relaunches == 2
    weights, _ = final_weights(services, "deadline-stale")
    assert np.array_equal(weights, np.concatenate([np.asarray(w).ravel() for w in model.get_weights()]))


def test_a_straggler_is_left_behind_at_the_deadline_floor(local, services, digits):
    """Worker 3 starts 8 s late every iteration; with a floor of one half the watchdog fires each reduce at
    the 2 s deadline with workers 0-2, so the run neither waits for it nor re-launches it."""
    spec = SPEC.model_copy(update={"iterations": 2, "deadline_s": 2.0, "deadline_floor": 0.5})
    with timeouts(local, 2), injecting(local, Faults.parse("late_worker=3:8")) as report:
        train(services, spec, "deadline-floor")
        run = finish(services, "deadline-floor")
    assert run.status == "COMPLETED", run.reason
    assert report["injected"]["late_worker"] >= 1
    iterations = services.table.list_iterations("deadline-floor")
    for record in iterations:
        assert record.fired_at_deadline, record
        assert [p.worker for p in record.participants] == [0, 1, 2] and not record.relaunched
    summary = runs.summarize(run, iterations, wall_s=0)
    assert (summary.deadlines_fired, summary.relaunched_workers) == (spec.iterations, 0)


def test_workers_that_hang_on_every_attempt_fail_the_run_within_its_deadline_budget(local, services, digits):
    spec = SPEC.model_copy(update={"workers": 2, "global_batch": 64, "deadline_s": 1.0, "deadline_retries": 1})
    hang = Faults(worker_hang=1.0, crash_every_receive=True, hang_s=3)
    with timeouts(local, 1), injecting(local, hang):
        train(services, spec, "deadline-hang")
        run = finish(services, "deadline-hang", timeout_s=60)
    assert run.status == "FAILED"
    assert run.reason.startswith(
        "work stage of iteration 0: 0 of 2 workers delivered an update within 2 deadlines of 1 s"
    ), run.reason
    record = services.table.get_iteration("deadline-hang", 0)
    assert record.relaunched == {0: 1, 1: 1} and not record.done
    budget = (spec.deadline_retries + 1) * spec.deadline_s
    assert budget <= run.updated_at - record.launched_at < budget + 3  # SQS delays are whole seconds


def test_workers_that_crash_on_every_attempt_fail_the_run_within_its_deadline_budget(local, services, digits):
    """Crashes, unlike hangs, use up a message's three receives within about two deadlines: the dead
    letter or the watchdog, whichever comes first, fails the run, naming the work stage."""
    spec = SPEC.model_copy(update={"workers": 2, "global_batch": 64, "deadline_s": 1.0, "deadline_retries": 1})
    with timeouts(local, 1), injecting(local, Faults(worker_crash=1.0, crash_every_receive=True)):
        train(services, spec, "deadline-crash")
        run = finish(services, "deadline-crash", timeout_s=60)
    assert run.status == "FAILED"
    assert re.match(
        r"worker failed three times on one message: .*crash"
        r"|work stage of iteration 0: 0 of 2 workers delivered an update within 2 deadlines",
        run.reason,
    ), run.reason
    record = services.table.get_iteration("deadline-crash", 0)
    assert not record.done and record.reduce_fired_by is None
    assert run.updated_at - record.launched_at < (spec.deadline_retries + 1) * spec.deadline_s + 3
