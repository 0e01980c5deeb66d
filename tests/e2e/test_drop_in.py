"""A plain S3 upload to incoming/ (no CLI) starts a run with the deployment's defaults."""

from __future__ import annotations

import hashlib
import json
import re
import time

from slsml.client import demo
from slsml.spec import keys
from slsml.training import modelio

from .conftest import finish


def _run_id_of(name: str, model: bytes) -> str:
    return f"{name}-{hashlib.sha256(model).hexdigest()[:8]}"


def test_a_model_dropped_in_incoming_trains_with_its_request(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=5))
    request = {"dataset": "digits", "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 3}}
    s3 = services.store.s3
    s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("dropped"), Body=json.dumps(request))
    s3.put_object(Bucket=services.store.bucket, Key="incoming/dropped.keras", Body=model)
    run_id = _run_id_of("dropped", model)
    for _ in range(300):  # the run starter registers it a moment after the upload
        if services.table.list_runs() and any(r.run_id == run_id for r in services.table.list_runs()):
            break
        time.sleep(0.1)
    run = finish(services, run_id, timeout_s=120)
    assert run.status == "COMPLETED", run.reason
    assert (run.iteration, run.workers, run.reducers) == (3, 2, 1)
    assert services.store.exists(keys.final_model(run_id))


def test_a_dropped_model_without_a_dataset_is_refused_with_a_reason(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=6))
    services.store.s3.put_object(Bucket=services.store.bucket, Key="incoming/nodata.keras", Body=model)
    log = local.log_dir / "run_starter.log"
    for _ in range(200):
        if log.exists() and "dropped model not started" in log.read_text():
            break
        time.sleep(0.1)
    text = log.read_text()
    assert "no dataset for incoming/nodata.keras" in text
    assert not any(r.run_id.startswith("nodata-") for r in services.table.list_runs())


def test_a_dropped_model_whose_budget_the_plan_exceeds_is_refused_naming_both_figures(local, services, digits) -> None:
    model = modelio.save_model(demo.digits_cnn(seed=7))
    request = {"dataset": "digits", "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 3,
                                                 "budget_usd": 1e-6}}
    s3 = services.store.s3
    s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("thrifty"), Body=json.dumps(request))
    s3.put_object(Bucket=services.store.bucket, Key="incoming/thrifty.keras", Body=model)
    log = local.log_dir / "run_starter.log"
    for _ in range(600):
        if log.exists() and "--budget-usd 1e-06" in log.read_text():
            break
        time.sleep(0.1)
    assert re.search(r"the plan predicts \$[\d.]+ for this run \(3 iterations\), above its budget of \$0\.000001",
                     log.read_text())
    assert not any(r.run_id.startswith("thrifty-") for r in services.table.list_runs())
    assert services.store.list_keys(f"runs/{_run_id_of('thrifty', model)}/") == []
