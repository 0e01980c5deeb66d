"""Injected faults (duplicated, delayed and crashing deliveries, slow S3 reads) through the whole
pipeline: runs still complete, and with a read quorum of 1 they end bit-identical to a clean run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from slsml.client import demo
from slsml.data import datasets as data
from slsml.local.faults import Delay, Faults
from slsml.pipeline import launch
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.reliability import ReadPolicy
from slsml.training import modelio

from .conftest import final_weights, finish, train, trained_clean

SPEC = TrainingSpec(
    workers=4,
    reducers=2,
    global_batch=128,
    iterations=3,
    eval_every=0,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
)

# each fault alone, then mixed; the seeds are fixed, so the same faults are injected every time
CASES: dict[str, Faults] = {
    "duplicate": Faults(seed=1, duplicate=0.5),
    "worker-crash": Faults(seed=2, worker_crash=0.25),
    "reducer-crash": Faults(seed=3, reducer_crash=0.5),
    "merger-crash": Faults(merger_crash_once=True),
    "worker-hang": Faults(seed=7, worker_hang=0.25, hang_s=0.5),  # one hung worker in each iteration
    "s3-get-delay": Faults(seed=4, s3_get_delay=Delay(probability=0.2, seconds=0.3)),
    "sns-delay": Faults(seed=5, sns_delay=Delay(probability=0.2, seconds=0.5)),
    "mixed": Faults.parse("seed=6,duplicate=0.5,worker_crash=0.25,s3_get_delay=0.2:0.3"),
}
INJECTED_BY = {
    "duplicate": "duplicate",
    "worker_crash": "worker_crash",
    "reducer_crash": "reducer_crash",
    "worker_hang": "worker_hang",
    "merger_crash_once": "merger_crash",
    "s3_get_delay": "s3_get_delay",
    "sns_delay": "sns_delay",
}


@contextmanager
def injecting(local, faults: Faults, environment: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Faults on the host for the block; yields a dict that is filled with the block's fault report."""
    host = local.host
    before = host.fault_report()
    host.faults, host.function_environment = faults, dict(environment or {})
    report: dict[str, Any] = {}
    try:
        yield report
    finally:
        host.faults, host.function_environment = None, {}
        after = host.fault_report()
        report["injected"] = {k: v - before["injected"][k] for k, v in after["injected"].items()}
        for name in ("invocations", "failed_invocations", "retries", "dead_letters"):
            report[name] = after[name] - before[name]
        report["errors"] = {
            e: n - before["errors"].get(e, 0) for e, n in after["errors"].items() if n > before["errors"].get(e, 0)
        }


def test_non_finite_updates_from_every_worker_fail_the_run(services, digits):
    x, y, x_test, y_test = digits
    data.put_dataset(services.store, "huge-digits", x * np.float32(3e38), y, x_test, y_test)  # the loss overflows
    spec = SPEC.model_copy(update={"workers": 2, "global_batch": 64})
    launch.start_run(services, modelio.save_model(demo.digits_cnn(seed=1)), "huge-digits", spec, run_id="faults-nan")
    run = finish(services, "faults-nan", timeout_s=120)
    assert run.status == "FAILED"
    assert "all 2 workers produced non-finite updates at iteration 0" in run.reason, run.reason
    record = services.table.get_iteration("faults-nan", 0)
    assert record.nonfinite == {0, 1} and record.reduce_fired_by is None


@pytest.fixture(scope="module")
def clean_weights(services, digits) -> np.ndarray:
    return trained_clean(services, SPEC, "faults-clean")


@pytest.mark.parametrize("name", list(CASES))
def test_a_run_under_faults_completes_bit_identical(local, services, digits, clean_weights, name):
    faults = CASES[name]
    run_id = f"faults-{name}"
    with injecting(local, faults) as report:
        train(services, SPEC, run_id)
        run = finish(services, run_id)
    print(f"{name} ({faults}): {report}")
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == SPEC.iterations
    weights, _ = final_weights(services, run_id)  # the final model loads
    assert np.array_equal(weights, clean_weights)
    for kind in (field for field in INJECTED_BY if getattr(faults, field)):
        assert report["injected"][INJECTED_BY[kind]] > 0, (kind, report)
    crashes = sum(report["injected"][k] for k in ("worker_crash", "reducer_crash", "merger_crash", "worker_hang"))
    assert report["failed_invocations"] >= crashes and report["retries"] >= crashes
    # none of the run's messages was dead-lettered (an earlier test's crashed messages may still arrive meanwhile)
    assert [letter for letter in local.host.dead_letters if letter["run_id"] == run_id] == []
    if faults.merger_crash_once:
        assert report["injected"]["merger_crash"] == 1
    for iteration in services.table.list_iterations(run_id):
        assert [p.worker for p in iteration.participants] == list(range(SPEC.workers))
        assert not iteration.dropped_parts and not iteration.nonfinite


def test_a_read_quorum_drops_a_part_that_is_too_slow(local, services, digits):
    """Every read of worker 1's update takes 3 s; reducers give up on it after 0.5 s (read quorum 0.5)."""
    spec = SPEC.model_copy(update={"workers": 2, "global_batch": 64})
    slow_worker = Faults(s3_get_delay=Delay(probability=1, seconds=3), s3_get_delay_match=r"/updates/00001")
    policy = ReadPolicy(timeout_s=0.5, quorum=0.5)
    with injecting(local, slow_worker, policy.environment()) as report:
        train(services, spec, "faults-read-quorum")
        run = finish(services, "faults-read-quorum")
    print(f"read quorum: {report}")
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == spec.iterations
    final_weights(services, "faults-read-quorum")
    iterations = services.table.list_iterations("faults-read-quorum")
    assert len(iterations) == spec.iterations
    for iteration in iterations:
        assert [p.worker for p in iteration.participants] == [0, 1]  # both reported in time…
        assert iteration.dropped_parts == {"0:1", "1:1"}  # …but both reducers left worker 1's part out
    assert report["injected"]["s3_get_delay"] >= spec.iterations * spec.reducers
