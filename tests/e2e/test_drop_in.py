"""A plain S3 upload to incoming/ (no CLI) starts a run with the deployment's defaults: on the local cloud, which
names none, TrainingSpec's, with a deadline that fits its functions' timeouts."""

from __future__ import annotations

import hashlib
import json
import re
import time

from slsml.client import demo
from slsml.spec import keys
from slsml.spec.limits import RunLimits
from slsml.training import modelio

from .conftest import finish


def _run_id_of(name: str, model: bytes, request: bytes = b"") -> str:
    return f"{name}-{hashlib.sha256(model + request).hexdigest()[:8]}"


def _settled(services, run_id: str, timeout_s: float = 120):
    """The run's record once the run starter registered it."""
    deadline = time.monotonic() + timeout_s
    while not any(r.run_id == run_id for r in services.table.list_runs()):
        assert time.monotonic() < deadline, f"{run_id} was never registered"
        time.sleep(0.1)
    return services.table.get_run(run_id)


def test_a_model_dropped_in_incoming_trains_with_its_request(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=5))
    request = {"dataset": "digits", "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 3}}
    s3 = services.store.s3
    body = json.dumps(request).encode()
    s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("dropped"), Body=body)
    s3.put_object(Bucket=services.store.bucket, Key="incoming/dropped.keras", Body=model)
    run_id = _run_id_of("dropped", model, body)
    _settled(services, run_id)  # the run starter registers it a moment after the upload
    run = finish(services, run_id, timeout_s=120)
    assert run.status == "COMPLETED", run.reason
    assert (run.iteration, run.workers, run.reducers) == (3, 2, 1)
    assert services.store.exists(keys.final_model(run_id))


def test_a_dropped_model_without_a_dataset_fails_its_run_with_the_reason(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=6))
    services.store.s3.put_object(Bucket=services.store.bucket, Key="incoming/nodata.keras", Body=model)
    run = _settled(services, _run_id_of("nodata", model))
    assert run.status == "FAILED"
    assert run.reason.startswith("incoming/nodata.keras not started: no dataset for incoming/nodata.keras"), run.reason
    assert "no dataset for incoming/nodata.keras" in (local.log_dir / "run_starter.log").read_text()


def test_a_dropped_model_whose_budget_the_plan_exceeds_is_refused_naming_both_figures(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=7))
    request = {
        "dataset": "digits",
        "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 3, "budget_usd": 1e-6},
    }
    s3 = services.store.s3
    body = json.dumps(request).encode()
    s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("thrifty"), Body=body)
    s3.put_object(Bucket=services.store.bucket, Key="incoming/thrifty.keras", Body=model)
    run_id = _run_id_of("thrifty", model, body)
    run = _settled(services, run_id)
    assert run.status == "FAILED"
    assert re.search(
        r"the plan predicts \$[\d.]+ for this run \(3 iterations\), above its budget of \$0\.000001", run.reason
    ), run.reason
    assert services.store.list_keys(f"runs/{run_id}/") == []


def test_a_dropped_model_without_a_deadline_gets_one_that_fits_the_worker_s_timeout(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=8))
    request = {"dataset": "digits", "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 2}}
    body = json.dumps(request).encode()
    slow_workers = RunLimits(function_timeouts_s={**RunLimits().function_timeouts_s, "worker": 300})
    with local.limited(slow_workers):
        s3 = services.store.s3
        s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("patient"), Body=body)
        s3.put_object(Bucket=services.store.bucket, Key="incoming/patient.keras", Body=model)
        run_id = _run_id_of("patient", model, body)
        _settled(services, run_id)
        run = finish(services, run_id, timeout_s=120)
    assert run.status == "COMPLETED", run.reason
    assert run.deadline_s == 300
