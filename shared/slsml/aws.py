"""boto3 clients with one retry policy. The endpoint comes from the standard ``AWS_ENDPOINT_URL``
variable, so the same code talks to AWS or to the embedded cloud.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3
from botocore.config import Config

RETRIES = Config(
    retries={"mode": "standard", "max_attempts": 6},
    connect_timeout=5,
    read_timeout=60,
    max_pool_connections=64,
)


@cache
def client(service: str) -> Any:
    return boto3.session.Session().client(service, config=RETRIES)


@cache
def resource(service: str) -> Any:
    return boto3.session.Session().resource(service, config=RETRIES)


def error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")
