"""How a pipeline function receives its messages: SNS (or SQS) records, each checked for size and parsed into
the function's message type, then its proof of origin checked (``slsml.pipeline.proof``) and what it says checked
against the run it names (``slsml.pipeline.admission``). A message that is too big, not JSON, not of that type, not
sent by the pipeline or not of its run is rejected: the reason is logged, counted
(``RejectedMessages``) and ``MessageRejected`` fails the invocation, so the message is retried and ends in
the function's dead-letter queue without touching any run. ``pipeline_handler`` is what every function's
handler is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache, partial
from typing import Annotated, Any, TypeVar, get_args, get_origin

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.parser.envelopes.base import BaseEnvelope
from aws_lambda_powertools.utilities.parser.models import SnsModel, SqsModel
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, TypeAdapter, ValidationError

from slsml.accounting import usage
from slsml.pipeline import admission, lifetime, spend
from slsml.pipeline.metrics import emit, emitting
from slsml.pipeline.proof import ends_execution
from slsml.pipeline.services import Services, failing_run_on_bad_input, from_env
from slsml.spec import keys
from slsml.spec.deployment import Metric
from slsml.spec.errors import ConfigReplaced, KeyForged, KeyLost, MessageRejected
from slsml.spec.messages import MAX_MESSAGE_BYTES, Message, ModelLanded
from slsml.state.idempotency import once_per_message

MAX_REASON_CHARS = 300  # of the validation errors in a rejection's reason

logger = Logger(child=True)
M = TypeVar("M", bound=BaseModel)


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
    raise reject(type_name(model), message_id, problem)


def reject(message_type: str, message_id: str, problem: str) -> MessageRejected:
    """The rejection of a message, logged and counted."""
    rejection = MessageRejected.of(message_type, message_id, problem)
    logger.error(str(rejection), extra={"message_id": message_id, "message_type": message_type, "problem": problem})
    emit(Metric.REJECTED_MESSAGES, 1)
    return rejection


def admit(message: Any, services: Services) -> None:
    """``MessageRejected`` (logged and counted) if ``message`` is a pipeline message whose proof of origin does not
    hold (``slsml.pipeline.proof``: checked first), or does not belong to the run it names. A message the pipeline
    sent whose run's ``run.json`` was replaced, or whose run lost its signing keys, fails that run, naming it, and is
    rejected."""
    try:
        forged = services.keys.problem(message) if isinstance(message, Message) else None
        problem = forged or admission.problem(message, services)
    except (ConfigReplaced, KeyLost, KeyForged) as replaced:
        logger.error("run failed", extra={"run_id": message.run_id, "reason": str(replaced)})
        services.fail_run(message.run_id, str(replaced))
        # the watchdog's end of a run's execution (asked by a step that failed it) reads no run.json and needs no key
        problem = None if ends_execution(message) else str(replaced)
    if problem is not None:
        name = f"{message.run_id}/{getattr(message, 'iteration', '-')}"
        raise reject(type(message).__name__, name, problem)


class SnsMessages(BaseEnvelope):
    """Powertools' SNS envelope with ``parse_message``'s checks on every record."""

    def parse(self, data: dict[str, Any] | Any | None, model: type[M]) -> list[M]:  # type: ignore[override]
        records = SnsModel.model_validate(data).Records
        return [parse_message(str(r.Sns.Message), model, r.Sns.MessageId) for r in records]


class SqsMessages(BaseEnvelope):
    """The same for a function triggered by a queue of its own."""

    def parse(self, data: dict[str, Any] | Any | None, model: type[M]) -> list[M]:  # type: ignore[override]
        return [parse_message(str(r.body), model, r.messageId) for r in SqsModel.model_validate(data).Records]


class DeadLetterRecords(BaseEnvelope):
    """A dead-letter queue's records as they are, for the step that reads them (``slsml.pipeline.steps.dead_letters``):
    the queue, the message id, the body (of any size: a message may have been rejected for its size) and
    the message attributes (Lambda's ``ErrorCode``, ``ErrorMessage`` and ``RequestID``, where it sent them)."""

    def parse(self, data: dict[str, Any] | Any | None, model: type[M]) -> list[M]:  # type: ignore[override]
        return [
            model.model_validate(
                {
                    "queue_arn": r.eventSourceARN,
                    "message_id": r.messageId,
                    "body": r.body,
                    "attributes": {
                        name: a.stringValue for name, a in r.messageAttributes.items() if a.stringValue is not None
                    },
                }
            )
            for r in SqsModel.model_validate(data).Records
        ]


def run_and_iteration(message: Any) -> tuple[str | None, int | None]:
    """What a message is about, for its usage scope: pipeline messages name both; a landed model its key
    (``runs/<run>/models/<iteration>.keras``); a run starting only its run (the scope is the run's, of no
    iteration); a dropped model neither (its step may name the run it starts: ``usage.attribute``)."""
    if isinstance(message, ModelLanded):
        return keys.parse_model_key(message.key) or (None, None)
    return getattr(message, "run_id", None), getattr(message, "iteration", None)


def pipeline_handler(
    function: str,
    model: Any,
    step: Callable[..., Any],
    *,
    envelope: type[BaseEnvelope] = SnsMessages,
    stage: Callable[[Any], str] | None = None,
    unpack: Callable[[Any], Iterable[Any]] = lambda message: (message,),
    idempotent: bool | Callable[[Any], bool] = True,
    batch_failures: bool = False,
    charges: bool = True,
    goes_on: Callable[[Any, Any, Services], Any | None] | None = None,
) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any] | None]:
    """The Lambda handler of pipeline function ``function`` (its wiring name, which its usage lines
    carry): ``step(message, services)`` for each message.

    Powertools Logger (the Lambda context in each line), Tracer, Metrics (cold starts; the number of
    messages as ``Messages``; what the step emits through ``slsml.pipeline.metrics``; the S3 bytes the invocation's
    usage lines count, as ``BytesRead`` and ``BytesWritten``) and Parser, which
    parses the event into ``model`` records (``envelope``). ``unpack`` turns a record into the messages
    to handle (the objects of an S3 event). Each message is checked against its run (``admit``), then handled in
    its own usage scope (``run_and_iteration``), once (Powertools Idempotency, unless ``idempotent`` is False: for
    a step that is idempotent by itself; or the messages it is true of), and, given ``stage`` (its name in a failed
    run's reason), with bad input failing its run (``failing_run_on_bad_input``). With ``batch_failures`` (an SQS
    batch of records that each carry a ``message_id``), a message the step fails on is logged and reported as the
    batch's failure alone (Lambda's partial batch response): the others are done with. Unless not ``charges`` (a
    function whose messages are not a run's work: the dead-letter reader's letters), each message's cost counts in
    its run's spend (``spend.count``). With ``goes_on``, a message handled may have the invocation go on to another
    (``goes_on(message, result, services)``: the step's own, not a sent one, so not admitted again), handled as the
    step's next message, in a scope of its own.
    """
    service_logger, tracer, metrics = Logger(), Tracer(), Metrics()

    def handle(records: list[Any], context: LambdaContext) -> dict[str, Any] | None:
        services = from_env(function)
        metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(records))
        plain: Callable[[Any], Any] = partial(step, services=services)
        once = once_per_message(plain, context) if idempotent else plain
        failures = []
        for sent in (message for record in records for message in unpack(record)):
            message, admitted = sent, False
            while message is not None:
                run = once if idempotent is True or (callable(idempotent) and idempotent(message)) else plain
                with usage.scope(*run_and_iteration(message), **usage.about(message)):
                    try:
                        if not admitted:
                            admit(message, services)
                        result = None  # (a late step, dropped, gives none)
                        try:
                            if stage is None:
                                result = run(message)
                            else:
                                with failing_run_on_bad_input(
                                    services, message.run_id, stage(message), message.iteration, message.generation
                                ):
                                    result = run(message)
                            message = None if goes_on is None else goes_on(message, result, services)
                        finally:
                            if charges:
                                spend.count(services)
                    except Exception as error:
                        if not batch_failures:
                            readable = error_first(error)
                            if readable is error:
                                raise
                            raise readable from error
                        logger.exception("message failed: retried alone", extra={"message_id": sent.message_id})
                        failures.append({"itemIdentifier": sent.message_id})
                        message = None
                admitted = True
        return {"batchItemFailures": failures} if batch_failures else None

    parsed = event_parser(model=model, envelope=envelope)(handle)

    def counted(event: dict[str, Any], context: LambdaContext) -> dict[str, Any] | None:
        with emitting():
            spent = None
            try:
                with usage.invocation(function, int(context.memory_limit_in_mb)) as spent, lifetime.invocation(context):
                    return parsed(event, context)
            finally:
                if spent is not None:
                    _emit_bytes(spent.bytes_read, spent.bytes_written)

    return service_logger.inject_lambda_context(
        tracer.capture_lambda_handler(metrics.log_metrics(counted, capture_cold_start_metric=True))
    )


TRACED = "in user code:"  # how TensorFlow's error of a function it traced begins: its frames, then the error


def error_first(error: Exception) -> Exception:
    """``error`` with what it says first, as Lambda reports an error's first KB alone: TensorFlow's error of traced
    code (``in user code:``, the frames, then the error) as an error of its type saying the error, then the frame that
    raised it; any other error as it is."""
    lines = str(error).splitlines()
    frames = [n for n, line in enumerate(lines) if line.strip().startswith("File ")]
    if not lines or lines[0].strip() != TRACED or not frames:
        return error
    said = " ".join(line.strip() for line in lines[frames[-1] + 2 :] if line.strip())
    said = said.removeprefix(f"{type(error).__name__}: ")
    try:
        return type(error)(f"{said} (raised in traced code: {lines[frames[-1]].strip()})")
    except Exception:  # an error type of other arguments: as it is
        return error


def _emit_bytes(read: int, written: int) -> None:
    """The S3 bytes an invocation moved, as its usage lines count them (none for a function that moved none)."""
    for metric, value in ((Metric.BYTES_READ, read), (Metric.BYTES_WRITTEN, written)):
        if value:
            emit(metric, value, MetricUnit.Bytes)
