"""How a pipeline function receives its messages: SNS (or SQS) records, each checked for size and parsed into
the function's message type. A message that is too big, not JSON or not of that type is rejected:
the reason is logged and ``MessageRejected`` fails the invocation, so the message is retried and ends
in the function's dead-letter queue without touching any run.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, TypeVar, get_args, get_origin

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.parser.envelopes.base import BaseEnvelope
from aws_lambda_powertools.utilities.parser.models import SnsModel, SqsModel
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import TypeAdapter, ValidationError

from slsml.errors import MessageRejected

MAX_MESSAGE_BYTES = 128 * 1024  # the biggest real message, a Reduce for 1000 workers, is 45 KiB; SNS allows 256
MAX_REASON_CHARS = 300  # of the validation errors in a rejection's reason

logger = Logger(child=True)
M = TypeVar("M")
Handler = Callable[[list[Any], LambdaContext], None]


def type_name(model: Any) -> str:
    """``WorkMessage``; ``RunStarted | S3Notification`` for an (annotated) union of models."""
    if get_origin(model) is Annotated:
        model = get_args(model)[0]
    return " | ".join(getattr(member, "__name__", str(member)) for member in get_args(model) or (model,))


@cache
def _adapter(model: Any) -> TypeAdapter:
    return TypeAdapter(model)


def _problems(error: ValidationError) -> str:
    """The validation errors on one line, without the (possibly huge) input."""
    if any(e["type"] == "json_invalid" for e in error.errors()):
        problems = "not JSON: " + error.errors()[0]["msg"]
    else:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or '(message)'}: {e['msg']}" for e in error.errors()
        )
    return problems if len(problems) <= MAX_REASON_CHARS else problems[: MAX_REASON_CHARS - 1] + "…"


def parse_message(body: str, model: Any, message_id: str) -> Any:
    """One SNS message body as ``model``, or ``MessageRejected`` (logged) naming what is wrong with it."""
    size = len(body.encode())
    if size > MAX_MESSAGE_BYTES:
        problem = f"{size} bytes, over the {MAX_MESSAGE_BYTES}-byte limit"
    else:
        try:
            return _adapter(model).validate_json(body)
        except ValidationError as error:
            problem = _problems(error)
    message_type = type_name(model)
    reason = f"{message_type} message {message_id} rejected: {problem}"
    logger.error(reason, extra={"message_id": message_id, "message_type": message_type, "problem": problem})
    raise MessageRejected(reason)


class SnsMessages(BaseEnvelope):
    """Powertools' SNS envelope with ``parse_message``'s checks on every record."""

    def parse(self, data: dict[str, Any] | Any | None, model: type[M]) -> list[M]:
        return [parse_message(r.Sns.Message, model, r.Sns.MessageId) for r in SnsModel.model_validate(data).Records]


class SqsMessages(BaseEnvelope):
    """The same for a function triggered by a queue of its own."""

    def parse(self, data: dict[str, Any] | Any | None, model: type[M]) -> list[M]:
        return [parse_message(r.body, model, r.messageId) for r in SqsModel.model_validate(data).Records]


def pipeline_handler(
    model: Any, envelope: type[BaseEnvelope] = SnsMessages
) -> Callable[[Handler], Callable[[dict[str, Any], LambdaContext], None]]:
    """What every pipeline function's handler is wrapped in: Powertools Logger (the Lambda context in
    each line), Tracer, Metrics (cold starts; a ``Metrics()`` of the handler's adds to the same set)
    and Parser, which hands the handler its messages as a list of ``model`` (see ``SnsMessages``)."""
    service_logger, tracer, metrics = Logger(), Tracer(), Metrics()

    def decorate(handler: Handler) -> Callable[[dict[str, Any], LambdaContext], None]:
        parsed = event_parser(model=model, envelope=envelope)(handler)
        return service_logger.inject_lambda_context(
            tracer.capture_lambda_handler(metrics.log_metrics(parsed, capture_cold_start_metric=True))
        )

    return decorate
