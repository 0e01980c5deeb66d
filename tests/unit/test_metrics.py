"""Custom metrics: a pipeline handler writes what its step emits and the S3 bytes its usage lines count in
one embedded-metric-format line (namespace and the service dimension); outside a handler nothing is kept."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Metrics
from moto import mock_aws

from slsml.local.host import LambdaContext
from slsml.pipeline import envelope, metrics
from slsml.pipeline.services import Services, from_env
from slsml.spec import wiring
from slsml.spec.deployment import METRICS_NAMESPACE, SERVICE_NAME, Metric
from slsml.spec.messages import WorkMessage

from .test_envelope import WORK, sns_event

BLOB = b"x" * 1234


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1", wiring.BUCKET_ENV: "bucket", wiring.TABLE_ENV: "runs",
        "POWERTOOLS_SERVICE_NAME": SERVICE_NAME, "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_TRACE_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    from_env.cache_clear()
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="bucket")
        boto3.client("s3").put_object(Bucket="bucket", Key="runs/r1/blob", Body=BLOB)
        yield
    from_env.cache_clear()


def emf_lines(out: str) -> list[dict[str, Any]]:
    return [entry for line in out.splitlines() if line.startswith("{") and "_aws" in (entry := json.loads(line))]


def test_a_handler_writes_its_steps_metrics_and_its_s3_bytes(deployed: Any, capsys: pytest.CaptureFixture) -> None:
    def step(message: WorkMessage, services: Services) -> None:
        services.store.get("runs/r1/blob")
        services.store.put_new("runs/r1/out", b"y" * 10)
        metrics.emit(Metric.LATE_WORKERS, 1)

    handler = envelope.pipeline_handler("worker", WorkMessage, step, idempotent=False)
    capsys.readouterr()
    handler(sns_event(json.dumps(WORK)), LambdaContext("worker", "request-1", 1e12, 3008))
    entries = [e for e in emf_lines(capsys.readouterr().out) if Metric.LATE_WORKERS.value in e]
    assert len(entries) == 1
    (entry,) = entries
    (directive,) = entry["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == METRICS_NAMESPACE and directive["Dimensions"] == [["service"]]
    assert entry["service"] == SERVICE_NAME
    values = {m: entry[m.value] for m in (Metric.LATE_WORKERS, Metric.BYTES_READ, Metric.BYTES_WRITTEN)}
    assert values == {Metric.LATE_WORKERS: [1.0], Metric.BYTES_READ: [len(BLOB)], Metric.BYTES_WRITTEN: [10.0]}


def test_a_handler_that_moves_no_bytes_emits_none(deployed: Any, capsys: pytest.CaptureFixture) -> None:
    handler = envelope.pipeline_handler("worker", WorkMessage, lambda message, services: None, idempotent=False)
    capsys.readouterr()
    handler(sns_event(json.dumps(WORK)), LambdaContext("worker", "request-2", 1e12, 3008))
    (entry,) = emf_lines(capsys.readouterr().out)[-1:]
    assert Metric.BYTES_READ.value not in entry and Metric.BYTES_WRITTEN.value not in entry


def test_outside_a_handler_nothing_is_kept() -> None:
    metrics.emit(Metric.WORKERS_DONE, 1)
    assert Metric.WORKERS_DONE.value not in Metrics().metric_set
