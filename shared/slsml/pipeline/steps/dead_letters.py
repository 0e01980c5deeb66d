"""DeadLetters: a message that a function failed on three times, or that SNS could not deliver to it,
fails the run it names, with the function's error.

A dead letter comes in one of three shapes, by the queue that holds it:

- Lambda's asynchronous-invocation DLQ (an SNS-triggered function failed on it three times: its
  first try and Lambda's two retries): the body is the function's event, whose SNS records name their
  topic, and Lambda attaches the error as message attributes: ``ErrorCode``, ``ErrorMessage`` (the
  exception's message, its first KB) and ``RequestID``;
- a subscription's DLQ (SNS could not deliver the message to the function): the body is SNS's
  envelope, which names the topic; no error;
- a trigger queue's DLQ (a queue-triggered function failed on it three times, and SQS moved it): the
  body is the message as it was sent; no error. The queue says whose it was.

``wiring.dead_letter_sources`` (in ``wiring.DEAD_LETTER_SOURCES_ENV``) maps topics and queues to the
functions they feed. A message the function rejected as malformed (``errors.rejected``, read from its
error) fails no run: a forged or corrupt message must not end a healthy run, and a real one lost this
way is launched again by the run's deadlines. SQS moves a queue-fed function's message without its error: it
is taken as rejected if that function would reject it now (``envelope.parse_message``, ``envelope.admit``).
Neither does a dead letter that names no run (a model
dropped under ``incoming/``, a body that is not JSON). Each dead letter is logged with its function,
run, error and message. The local host hands its dead letters to this same step, in these shapes
(``slsml.local.host``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger
from pydantic import BaseModel, ConfigDict, Field

from slsml.pipeline.envelope import admit, parse_message
from slsml.pipeline.services import Services
from slsml.spec import wiring
from slsml.spec.errors import MessageRejected, rejected
from slsml.spec.messages import (
    DEAD_LETTER_ERROR_CODE,
    DEAD_LETTER_ERROR_MESSAGE,
    DEAD_LETTER_REQUEST_ID,
    Deadline,
    run_named,
)

logger = Logger(child=True)
LOGGED_MESSAGE_CHARS = 2000  # of a dead-lettered message, in its log line
QUEUED_MESSAGES: dict[str, type] = {"watchdog": Deadline}  # what each queue-fed function's queue carries


class DeadLetter(BaseModel):
    """One record of a dead-letter queue (``envelope.DeadLetterRecords``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_arn: str
    message_id: str
    body: str
    attributes: dict[str, str] = Field(default_factory=dict, description="its message attributes' string values")

    @property
    def run_id(self) -> str | None:
        """The run it names, if any (its usage scope's)."""
        return next((run for _, message in _messages(self.body) if (run := run_named(message))), None)


@dataclass(frozen=True)
class Letter:
    """What a dead letter says: whose message it was, the message, the run it names and why it was dead-lettered."""

    function: str | None
    message: str
    run_id: str | None
    error: str | None  # the function's, where Lambda attached it
    undelivered: bool  # SNS could not deliver it (a subscription's DLQ)

    @property
    def reason(self) -> str:
        """The failed run's reason."""
        function = self.function or "a pipeline function"
        if self.undelivered:
            return f"SNS could not deliver a message to {function} (its subscription's dead-letter queue has it)"
        if self.error is None:
            return f"{function} failed three times on one message (its error is in {function}'s log)"
        return f"{function} failed three times on one message: {self.error}"


def _messages(body: str) -> list[tuple[str | None, str]]:
    """(topic ARN or None, message) for each message a dead letter's body holds: the SNS records of a Lambda
    event, SNS's envelope, or else the body itself (a message as it was sent to a queue)."""
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return [(None, body)]
    if isinstance(parsed, dict) and isinstance(parsed.get("Records"), list):
        sns = [r["Sns"] for r in parsed["Records"] if isinstance(r, dict) and isinstance(r.get("Sns"), dict)]
        if sns and all(isinstance(s.get("Message"), str) for s in sns):
            return [(s.get("TopicArn"), s["Message"]) for s in sns]
    if isinstance(parsed, dict) and parsed.get("Type") == "Notification" and isinstance(parsed.get("Message"), str):
        return [(parsed.get("TopicArn"), parsed["Message"])]
    return [(None, body)]


def _is_envelope(body: str) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("Type") == "Notification"


def read(letter: DeadLetter, sources: dict[str, list[list[str]]]) -> list[Letter]:
    """What ``letter`` says, one ``Letter`` per message it holds (``sources``: ``wiring.dead_letter_sources``)."""
    error = letter.attributes.get(DEAD_LETTER_ERROR_MESSAGE)
    undelivered = error is None and _is_envelope(letter.body)
    queue_function = {arn: name for arn, name in sources.get("queues", [])}.get(letter.queue_arn)
    topics = {arn: name for arn, name in sources.get("topics", [])}
    return [
        Letter(
            function=topics.get(topic or "") or queue_function,
            message=message,
            run_id=run_named(message),
            error=error,
            undelivered=undelivered,
        )
        for topic, message in _messages(letter.body)
    ]


def _rejected_now(said: Letter, letter: DeadLetter, services: Services) -> bool:
    """Whether the queue-fed function whose message SQS moved here (no error with it) would reject it now."""
    model = QUEUED_MESSAGES.get(said.function or "")
    if model is None or said.undelivered:
        return False
    try:
        admit(parse_message(said.message, model, letter.message_id), services)
    except MessageRejected:
        return True
    return False


@cache
def deployed_sources() -> dict[str, list[list[str]]]:
    """The deployment's ``wiring.dead_letter_sources``, from the function's environment."""
    return json.loads(os.environ.get(wiring.DEAD_LETTER_SOURCES_ENV) or "{}")


def on_dead_letter(letter: DeadLetter, services: Services) -> list[str]:
    """Log each message ``letter`` holds and fail the run it names, unless its function rejected it as
    malformed; returns the runs it failed (a run no longer running is left as it is)."""
    failed: list[str] = []
    for said in read(letter, deployed_sources()):
        is_rejection = rejected(said.error) if said.error is not None else _rejected_now(said, letter, services)
        logger.error(
            "dead letter",
            extra={
                "function": said.function,
                "run_id": said.run_id,
                "error": said.error,
                "rejected": is_rejection,
                "undelivered": said.undelivered,
                "dead_letter_id": letter.message_id,
                "queue": letter.queue_arn,
                "error_code": letter.attributes.get(DEAD_LETTER_ERROR_CODE),
                "request_id": letter.attributes.get(DEAD_LETTER_REQUEST_ID),
                "dead_message": said.message[:LOGGED_MESSAGE_CHARS],
            },
        )
        if said.run_id is None or is_rejection:
            continue
        if services.fail_run(said.run_id, said.reason):
            logger.error("run failed", extra={"run_id": said.run_id, "reason": said.reason})
            failed.append(said.run_id)
    return failed
