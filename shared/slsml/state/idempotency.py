"""Once per message: SNS delivers at least once, so every step runs under Powertools Idempotency,
keyed on the message content, with its records in the run table. A duplicate that arrives while
the first copy is still being processed is dropped: that copy's own retries cover a crash.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache, wraps
from typing import Any, TypeVar

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

from slsml.aws import clients as aws
from slsml.spec import wiring
from slsml.state.records import TTL_ATTRIBUTE

logger = Logger(child=True)
# a message's record expires (DynamoDB TTL) once no copy of it can come: SQS keeps a message 14 days at most
RECORD_TTL_S = 14 * 24 * 3600
CONFIG = IdempotencyConfig(expires_after_seconds=RECORD_TTL_S)
M = TypeVar("M", bound=BaseModel)


@cache
def _persistence(function_name: str) -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(
        table_name=os.environ[wiring.TABLE_ENV],
        key_attr="pk",
        sort_key_attr="sk",
        static_pk_value=f"IDEMPOTENCY#{function_name}",
        expiry_attr=TTL_ATTRIBUTE,
        boto3_client=aws.client("dynamodb"),  # counted with the function's other requests (slsml.accounting.usage)
    )


def once_per_message(step: Callable[[M], Any], context: LambdaContext) -> Callable[[M], Any]:
    """``step(message)`` run at most once per distinct message (a failed run may be retried)."""
    CONFIG.register_lambda_context(context)

    @idempotent_function(
        data_keyword_argument="message", persistence_store=_persistence(context.function_name), config=CONFIG
    )
    def run_once(message: M) -> Any:
        return _jsonable(step(message))

    @wraps(step)
    def guarded(message: M) -> Any:
        try:
            return run_once(message=message)
        except IdempotencyAlreadyInProgressError:
            logger.info("duplicate of a message in progress: dropped", extra={"duplicate": message.model_dump()})
            return None

    return guarded


def _jsonable(result: Any) -> Any:
    """What the idempotency record stores of a step's result."""
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    if isinstance(result, list | tuple):
        return [_jsonable(item) for item in result]
    return result if result is None or isinstance(result, str | int | float | bool) else str(result)
