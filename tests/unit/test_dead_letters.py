"""The dead-letter reader: each shape an AWS dead-letter queue holds (Lambda's asynchronous-invocation
DLQ with the error it attaches, a subscription's DLQ, a trigger queue's DLQ), parsed as its event source
mapping delivers it, fails the run it names with the function's error; a rejected message or one that
names no run fails none."""

from __future__ import annotations

import json
from typing import Any

import pytest
from moto import mock_aws

from slsml.local.host import LambdaContext, error_message
from slsml.pipeline.envelope import DeadLetterRecords, pipeline_handler
from slsml.pipeline.services import Services, deployment_services
from slsml.pipeline.steps import dead_letters
from slsml.pipeline.steps.dead_letters import DeadLetter, on_dead_letter
from slsml.spec import wiring
from slsml.spec.deployment import METRICS_NAMESPACE

from .test_envelope import sns_event

WORK_TOPIC = "arn:aws:sns:us-east-1:000000000000:Work"  # test_envelope's SNS events come from it
WORK_DONE_TOPIC = "arn:aws:sns:us-east-1:000000000000:WorkDone"
MODEL_UPDATED_TOPIC = "arn:aws:sns:us-east-1:000000000000:ModelUpdated"
FAILURES = "arn:aws:sqs:us-east-1:000000000000:FunctionFailuresDlq"
REDUCE_LAUNCHER_SUBSCRIPTION = "arn:aws:sqs:us-east-1:000000000000:ReduceLauncherSubscriptionDlq"
DEADLINES_DLQ = "arn:aws:sqs:us-east-1:000000000000:DeadlinesDlq"
SOURCES = {
    "queues": [[REDUCE_LAUNCHER_SUBSCRIPTION, "reduce_launcher"], [DEADLINES_DLQ, "watchdog"]],
    "topics": [[WORK_TOPIC, "worker"], [WORK_DONE_TOPIC, "reduce_launcher"], [MODEL_UPDATED_TOPIC, "work_launcher"]],
}
WORK = json.dumps({"run_id": "r1", "iteration": 3, "worker": 2})


class FailingServices:
    """What the step may use: ``fail_run`` (recorded), of runs that are running."""

    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.failed: list[tuple[str, str]] = []

    def fail_run(self, run_id: str, reason: str) -> bool:
        self.failed.append((run_id, reason))
        was_running = run_id in self.running
        self.running.discard(run_id)
        return was_running


def sqs_record(body: str, queue_arn: str, attributes: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """One record as Lambda's SQS event source mapping hands it over (attributes: name → (type, value))."""
    return {
        "messageId": "dead-1",
        "receiptHandle": "handle",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1700000000000",
            "SenderId": "AROA",
            "ApproximateFirstReceiveTimestamp": "1700000000001",
        },
        "messageAttributes": {
            name: {"stringValue": value, "dataType": kind, "stringListValues": [], "binaryListValues": []}
            for name, (kind, value) in (attributes or {}).items()
        },
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": "us-east-1",
    }


def parsed(*records: dict[str, Any]) -> list[DeadLetter]:
    return DeadLetterRecords().parse({"Records": list(records)}, DeadLetter)


def lambda_dead_letter(message: str, error: str, topic: str = WORK_TOPIC) -> DeadLetter:
    """What Lambda leaves in its asynchronous-invocation DLQ: the function's event, and the error."""
    event = sns_event(message)
    event["Records"][0]["Sns"]["TopicArn"] = topic
    attributes = {"ErrorCode": ("Number", "200"), "ErrorMessage": ("String", error), "RequestID": ("String", "req")}
    (letter,) = parsed(sqs_record(json.dumps(event), FAILURES, attributes))
    return letter


@pytest.fixture(autouse=True)
def _sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters, "deployed_sources", lambda: SOURCES)


def test_a_function_failing_three_times_fails_the_run_with_its_error() -> None:
    letter = lambda_dead_letter(WORK, "1 validation error for RunConfig\nrun_id\n  Field required")
    assert letter.attributes["ErrorCode"] == "200" and letter.run_id == "r1"
    services = FailingServices({"r1"})
    assert on_dead_letter(letter, services) == ["r1"]
    assert services.failed == [
        ("r1", "worker failed three times on one message: 1 validation error for RunConfig\nrun_id\n  Field required")
    ]


def test_a_model_event_fails_the_run_of_the_model() -> None:
    key = "runs/r9/models/000003.json"  # the manifest whose event launches iteration 3
    s3_event = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"object": {"key": key}}}]}
    services = FailingServices({"r9"})
    assert on_dead_letter(lambda_dead_letter(json.dumps(s3_event), "boom", MODEL_UPDATED_TOPIC), services) == ["r9"]
    assert services.failed == [("r9", "work_launcher failed three times on one message: boom")]


@pytest.mark.parametrize(
    "error",
    [
        "WorkMessage message m-1 rejected: not JSON: Invalid JSON",
        "RunStarted | S3Notification message m-2 rejected: RunStarted: Input should be a valid dictionary",
        "MessageRejected: WorkDone message m-3 rejected: samples: Field required",
    ],
)
def test_a_message_its_function_rejected_fails_no_run(error: str) -> None:
    services = FailingServices({"r1"})
    assert on_dead_letter(lambda_dead_letter(WORK, error), services) == []
    assert services.failed == []


def test_a_dead_letter_that_names_no_run_fails_none() -> None:
    dropped = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"object": {"key": "incoming/mine.keras"}}}]}
    services = FailingServices(set())
    for message in ("not json at all", json.dumps(dropped), json.dumps([1, 2])):
        assert on_dead_letter(lambda_dead_letter(message, "boom"), services) == []
    assert services.failed == []


def test_a_message_sns_could_not_deliver_fails_its_run() -> None:
    done = json.dumps({"run_id": "r2", "iteration": 0, "worker": 1, "samples": 4, "loss": 1.0, "compute_s": 0.1})
    envelope = {
        "Type": "Notification",
        "MessageId": "sns-1",
        "TopicArn": WORK_DONE_TOPIC,
        "Message": done,
        "Timestamp": "2024-01-01T00:00:00.000Z",
    }
    (letter,) = parsed(sqs_record(json.dumps(envelope), REDUCE_LAUNCHER_SUBSCRIPTION))
    services = FailingServices({"r2"})
    assert on_dead_letter(letter, services) == ["r2"]
    assert services.failed == [
        ("r2", "SNS could not deliver a message to reduce_launcher (its subscription's dead-letter queue has it)")
    ]


def test_a_run_no_longer_running_is_left_as_it_is() -> None:
    services = FailingServices(set())
    assert on_dead_letter(lambda_dead_letter(WORK, "boom"), services) == []
    assert services.failed == [("r1", "worker failed three times on one message: boom")]  # tried, changed nothing


def test_a_dead_letter_of_any_size_is_read() -> None:
    big = json.dumps({"run_id": "r1", "iteration": 0, "worker": 0}).ljust(200_000)
    assert lambda_dead_letter(big, "ReduceMessage message m rejected: 200000 bytes, over the limit").run_id == "r1"


def test_the_local_host_reports_an_error_as_lambda_does() -> None:
    text = (
        "ValidationError: 1 validation error for RunConfig\nrun_id\n  Field required\nTraceback (most recent call"
        ' last):\n  File "x.py", line 1\nValidationError: ...'
    )
    assert error_message(text) == "1 validation error for RunConfig\nrun_id\n  Field required"
    assert error_message("KeyError\nTraceback (most recent call last):\n...") == "KeyError"
    assert len(error_message("ValueError: " + "é" * 2000).encode()) <= 1024


def _function_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a function's handler reads from its environment."""
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        wiring.BUCKET_ENV: "b",
        wiring.TABLE_ENV: "t",
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_TRACE_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    deployment_services.cache_clear()


def test_a_letter_the_reader_fails_on_is_retried_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lambda's partial batch response: the reader's batch of letters reports the one it failed on, and is done
    with the others (which a failed batch would have held back and redelivered with it)."""
    _function_environment(monkeypatch)
    handled: list[str] = []

    def step(letter: DeadLetter, services: Services) -> None:
        if letter.message_id == "poison":
            raise RuntimeError("the run's table is not reachable")
        handled.append(letter.message_id)

    handler = pipeline_handler(
        "dead_letters",
        DeadLetter,
        step,
        envelope=DeadLetterRecords,
        idempotent=False,
        batch_failures=True,
        charges=False,
    )  # as functions/dead_letters/handler.py
    records = [sqs_record(WORK, FAILURES) | {"messageId": name} for name in ("first", "poison", "last")]
    try:
        # in moto: the clients the handler's services make (and the process keeps) hold its credentials
        with mock_aws():
            answer = handler({"Records": records}, LambdaContext("dead_letters", "request-1", 1e12, 256))
    finally:
        deployment_services.cache_clear()
    assert answer == {"batchItemFailures": [{"itemIdentifier": "poison"}]}
    assert handled == ["first", "last"]


def test_an_error_of_traced_code_is_reported_by_what_it_says_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow's error of a traced function leads with its frames: a deep stack pushes the error itself past the
    first KB Lambda reports (the run's reason said only "in user code: File …"). The handler raises it with the error
    first, then the frame that raised it; other errors are raised as they are."""
    import tensorflow as tf

    from slsml.pipeline.envelope import error_first

    def deep(x: Any, depth: int) -> Any:
        if depth:
            return deep(x, depth - 1)
        raise ValueError(f"the labels of {x.shape[0]} samples\ndo not fit the outputs")

    traced = tf.function(lambda x: deep(x, 30))
    with pytest.raises(ValueError) as raised:
        traced(tf.zeros(3))
    assert "the labels of 3 samples" not in error_message(f"ValueError: {raised.value}")  # what Lambda reported
    readable = error_first(raised.value)
    assert type(readable) is ValueError
    reported = error_message(f"ValueError: {readable}")
    assert reported.startswith("the labels of 3 samples do not fit the outputs (raised in traced code: File ")
    assert ", in deep" in reported
    plain = KeyError("x")
    assert error_first(plain) is plain

    _function_environment(monkeypatch)

    def step(letter: DeadLetter, services: Services) -> None:
        traced(tf.zeros(4))

    handler = pipeline_handler(
        "dead_letters", DeadLetter, step, envelope=DeadLetterRecords, idempotent=False, charges=False
    )
    try:
        with mock_aws(), pytest.raises(ValueError) as handled:
            handler({"Records": [sqs_record(WORK, FAILURES)]}, LambdaContext("dead_letters", "request-1", 1e12, 256))
    finally:
        deployment_services.cache_clear()
    assert error_message(f"ValueError: {handled.value}").startswith("the labels of 4 samples do not fit the outputs")
