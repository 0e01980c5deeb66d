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
from slsml.pipeline.services import Services, deployment_services
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.deployment import METRICS_NAMESPACE, SERVICE_NAME, Metric
from slsml.spec.errors import MessageRejected
from slsml.spec.messages import WorkMessage
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.state import records
from slsml.state.runtable import RunTable

from . import cloud
from .test_envelope import WORK, sns_event

BLOB = b"x" * 1234


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        wiring.BUCKET_ENV: "bucket",
        wiring.TABLE_ENV: "runs",
        "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_TRACE_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    deployment_services.cache_clear()
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="bucket")
        boto3.client("s3").put_object(Bucket="bucket", Key="runs/r1/blob", Body=BLOB)
        boto3.client("dynamodb").create_table(**records.create_table_arguments("runs"))
        cloud.signing_key(monkeypatch)
        spec = TrainingSpec(workers=4, reducers=1)  # run r1, its iteration 3 launched (WORK's)
        plan = ShardPlan.build([VariableSpec(name="kernel", shape=(2,), trainable=True)], 1)
        config = RunConfig(
            run_id="r1",
            dataset="d",
            training=spec,
            optimizer=OptimizerConfig(name="adam"),
            loss="mse",
            classification=True,
            plan=plan,
        )
        run_json = config.model_dump_json().encode()
        boto3.client("s3").put_object(Bucket="bucket", Key=keys.run_config("r1"), Body=run_json)
        table = RunTable(boto3.resource("dynamodb").Table("runs"))
        item = records.run_item("r1", "d", spec, 0.0, config_digest(run_json))  # registered with its run.json
        # its first launch made its keys
        deployment_services(None, "{}").keys.sign(WorkMessage(run_id="r1", iteration=0, worker=0, workers=4))
        table.table.put_item(Item={**item, "iteration": 3})
        table.claim_launch("r1", 3, "test", workers=4)
        yield run_json
    deployment_services.cache_clear()


def signed(fields: dict[str, Any]) -> str:
    """A Work message of ``fields`` as the pipeline sends it: with its proof of origin, by the WorkLauncher's key of
    run r1 (signed by the deployment's owner, as the WorkLauncher)."""
    return deployment_services(None, "{}").keys.sign(WorkMessage.model_validate(fields)).model_dump_json()


def emf_lines(out: str) -> list[dict[str, Any]]:
    return [entry for line in out.splitlines() if line.startswith("{") and "_aws" in (entry := json.loads(line))]


def test_a_handler_writes_its_steps_metrics_and_its_s3_bytes(deployed: bytes, capsys: pytest.CaptureFixture) -> None:
    def step(message: WorkMessage, services: Services) -> None:
        services.store.get("runs/r1/blob")
        services.store.put_new("runs/r1/out", b"y" * 10)
        metrics.emit(Metric.LATE_WORKERS, 1)

    handler = envelope.pipeline_handler("worker", WorkMessage, step, idempotent=False)
    capsys.readouterr()
    handler(sns_event(signed(WORK)), LambdaContext("worker", "request-1", 1e12, 3008))
    entries = [e for e in emf_lines(capsys.readouterr().out) if Metric.LATE_WORKERS.value in e]
    assert len(entries) == 1
    (entry,) = entries
    (directive,) = entry["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == METRICS_NAMESPACE and directive["Dimensions"] == [["service"]]
    assert entry["service"] == SERVICE_NAME
    values = {m: entry[m.value] for m in (Metric.LATE_WORKERS, Metric.BYTES_READ, Metric.BYTES_WRITTEN)}
    read = len(BLOB) + len(deployed)  # the blob, and the run's config (the message's check reads it, cold)
    assert values == {Metric.LATE_WORKERS: [1.0], Metric.BYTES_READ: [read], Metric.BYTES_WRITTEN: [10.0]}


def test_a_handler_that_moves_no_bytes_emits_none(deployed: Any, capsys: pytest.CaptureFixture) -> None:
    handler = envelope.pipeline_handler("worker", WorkMessage, lambda message, services: None, idempotent=False)
    capsys.readouterr()
    handler(sns_event(signed(WORK)), LambdaContext("worker", "request-2", 1e12, 3008))
    (entry,) = emf_lines(capsys.readouterr().out)[-1:]
    assert Metric.BYTES_READ.value not in entry and Metric.BYTES_WRITTEN.value not in entry


def test_outside_a_handler_nothing_is_kept() -> None:
    metrics.emit(Metric.WORKERS_DONE, 1)
    assert Metric.WORKERS_DONE.value not in Metrics().metric_set


def test_a_message_not_of_its_run_is_rejected_and_counted(deployed: Any, capsys: pytest.CaptureFixture) -> None:
    def step(message: WorkMessage, services: Services) -> None:
        pytest.fail("the step acted on a message of an iteration the run is not at")

    handler = envelope.pipeline_handler("worker", WorkMessage, step, idempotent=False)
    capsys.readouterr()
    past = WORK | {"iteration": TrainingSpec().iterations + 1}  # signed, but past the run's iteration budget
    for number, (body, rejection) in enumerate(
        [
            (json.dumps(WORK), "r1/3 rejected: it carries no proof of origin"),
            (signed(past), f"r1/{past['iteration']} rejected: iteration {past['iteration']} is past the run's"),
        ]
    ):
        with pytest.raises(MessageRejected, match=f"WorkMessage message {rejection}"):
            handler(sns_event(body), LambdaContext("worker", f"request-{3 + number}", 1e12, 3008))
        (entry,) = [e for e in emf_lines(capsys.readouterr().out) if Metric.REJECTED_MESSAGES.value in e]
        assert entry[Metric.REJECTED_MESSAGES.value] == [1.0]
