"""boto3 clients with one retry policy. The endpoint comes from the standard ``AWS_ENDPOINT_URL``
variable, so the same code talks to AWS or to the embedded cloud. Each client counts what it sends
(``slsml.usage``).
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

from slsml import usage

RETRIES = Config(
    retries={"mode": "standard", "max_attempts": 6},
    connect_timeout=5,
    read_timeout=60,
    max_pool_connections=64,
)


def client(service: str) -> Any:
    return _client(service, os.environ.get("AWS_ENDPOINT_URL"))


def resource(service: str) -> Any:
    return _resource(service, os.environ.get("AWS_ENDPOINT_URL"))


# cached per endpoint: a process that starts a second embedded cloud must not reach the first
@cache
def _client(service: str, endpoint: str | None) -> Any:
    made = boto3.session.Session().client(service, config=RETRIES, endpoint_url=endpoint)
    usage.instrument(made)
    return made


@cache
def _resource(service: str, endpoint: str | None) -> Any:
    made = boto3.session.Session().resource(service, config=RETRIES, endpoint_url=endpoint)
    usage.instrument(made.meta.client)
    return made


def error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")
