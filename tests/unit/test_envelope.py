"""Incoming SNS messages: parsed into the function's message type, or rejected with a reason."""

from __future__ import annotations

import json
import logging

import pytest

from slsml.aws.storage import etag_of
from slsml.pipeline import envelope
from slsml.pipeline.envelope import MAX_MESSAGE_BYTES, MAX_REASON_CHARS, SnsMessages
from slsml.spec.config import MAX_WORKERS, TrainingSpec
from slsml.spec.errors import MessageRejected
from slsml.spec.messages import LauncherEvent, Participant, ReduceMessage, RunStarted, S3Notification, WorkMessage

WORK = {"run_id": "r1", "iteration": 3, "worker": 2, "workers": 4}


def sns_event(*bodies: str) -> dict:
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": "arn:aws:sns:us-east-1:000000000000:Work:worker",
                "Sns": {
                    "Type": "Notification",
                    "MessageId": f"message-{i}",
                    "TopicArn": "arn:aws:sns:us-east-1:000000000000:Work",
                    "Subject": None,
                    "Message": body,
                    "Timestamp": "2024-01-01T00:00:00.000Z",
                    "SignatureVersion": "1",
                    "Signature": "",
                    "SigningCertUrl": "https://sns.amazonaws.com/cert.pem",
                    "UnsubscribeUrl": "https://sns.amazonaws.com/unsubscribe",
                    "MessageAttributes": {},
                },
            }
            for i, body in enumerate(bodies)
        ]
    }


def rejection(body: str, model: object = WorkMessage) -> str:
    with pytest.raises(MessageRejected) as rejected:
        SnsMessages().parse(sns_event(json.dumps(WORK), body), model)
    return str(rejected.value)


def test_every_record_is_parsed_into_the_message_type() -> None:
    second = {**WORK, "worker": 3}
    assert SnsMessages().parse(sns_event(json.dumps(WORK), json.dumps(second)), WorkMessage) == [
        WorkMessage(**WORK),
        WorkMessage(**second),
    ]


def test_a_union_is_parsed_into_its_first_matching_member() -> None:
    started = {"run_id": "r1", "task_token": "token"}
    parsed = SnsMessages().parse(sns_event(json.dumps(started), json.dumps({"Records": []})), LauncherEvent)
    assert parsed == [RunStarted(**started), S3Notification()]


def test_the_biggest_real_message_is_under_the_size_limit() -> None:
    """A Reduce for the most workers, each named with its update's ETag: 108 KiB, 15% under the limit."""
    workers = TrainingSpec(workers=MAX_WORKERS, global_batch=MAX_WORKERS).workers
    participants = tuple(
        Participant(worker=w, attempt=99, samples=10**7, etag=etag_of(b"update")) for w in range(workers)
    )
    reduce = ReduceMessage(run_id="r" * 63, iteration=999_999, shard=255, participants=participants)
    assert 1.15 * len(reduce.model_dump_json()) < MAX_MESSAGE_BYTES


def test_a_message_over_the_size_limit_is_rejected_before_it_is_parsed() -> None:
    at_limit = json.dumps(WORK).ljust(MAX_MESSAGE_BYTES)  # JSON may end in any amount of blank space
    assert SnsMessages().parse(sns_event(at_limit), WorkMessage) == [WorkMessage(**WORK)]
    reason = rejection(at_limit + " ")
    assert reason == (
        f"WorkMessage message message-1 rejected: {MAX_MESSAGE_BYTES + 1} bytes, "
        f"over the {MAX_MESSAGE_BYTES}-byte limit"
    )


def test_a_body_that_is_not_json_is_rejected() -> None:
    reason = rejection("run r1, iteration 3, please")
    assert reason.startswith("WorkMessage message message-1 rejected: not JSON: Invalid JSON"), reason


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        ({"run_id": "r1", "worker": 2, "workers": 4}, "iteration: Field required"),
        ({**WORK, "shard": 1}, "shard: Extra inputs are not permitted"),
        ({**WORK, "iteration": -1}, "iteration: Input should be greater than or equal to 0"),
        ([WORK], "(message): Input should be an object"),
        ({**WORK, "schema_version": 2}, "schema_version: Input should be 1"),
    ],
)
def test_a_message_that_is_not_of_the_type_names_what_is_wrong(body: object, problems: str) -> None:
    assert rejection(json.dumps(body)) == f"WorkMessage message message-1 rejected: {problems}"


def test_the_validation_errors_of_a_union_name_its_members_and_are_truncated() -> None:
    reason = rejection(json.dumps([1]), LauncherEvent)
    assert reason.startswith(
        "RunStarted | ModelMerged | S3Notification message message-1 rejected: RunStarted: Input should"
    )
    many = {f"field_{i}": i for i in range(100)}
    problems = rejection(json.dumps({**WORK, **many})).split(" rejected: ", 1)[1]
    assert len(problems) == MAX_REASON_CHARS and problems.endswith("…")
    assert problems.startswith("field_0: Extra inputs are not permitted; field_1: ")


def test_the_reason_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger=envelope.logger.name)
    reason = rejection('{"run_id": "r1"}')
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == reason
    assert record.message_id == "message-1" and record.message_type == "WorkMessage"
