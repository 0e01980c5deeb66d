"""boto3 clients with one retry policy. The endpoint comes from the standard ``AWS_ENDPOINT_URL``
variable, so the same code talks to AWS or to the embedded cloud. Each client counts what it sends
(``slsml.accounting.usage``). A client of an endpoint so named signs with the credentials the environment names
as it is made (the embedded cloud's own: each cloud has its own, and refuses others), not those the session read
when it made its first client.

The clients of a process come from one session, boto3's default: botocore reads its service descriptions
(JSON, several MB) once per session, so a client of a session of its own would read them again — about a
quarter of a second of a cold start for the five services a function uses. A session is not safe to make
clients from in several threads at once: they are made one at a time.
"""

from __future__ import annotations

import os
import threading
from functools import cache
from typing import Any

import boto3
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

from slsml.accounting import usage

RETRIES = Config(
    retries={"mode": "standard", "max_attempts": 6},
    connect_timeout=5,
    read_timeout=60,
    max_pool_connections=64,
)


def client(service: str) -> Any:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return _client(service, endpoint, *_endpoint_keys(endpoint))


def resource(service: str) -> Any:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return _resource(service, endpoint, *_endpoint_keys(endpoint))


def _endpoint_keys(endpoint: str | None) -> tuple[str | None, str | None]:
    """The access key id and secret the environment names, for a client of ``endpoint``; none for AWS's own
    endpoints, whose clients take the session's credentials (a profile's, a role's)."""
    if endpoint is None:
        return None, None
    return os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")


_making = threading.Lock()


def _session() -> boto3.session.Session:
    """boto3's default session, made if there is none yet."""
    if boto3.DEFAULT_SESSION is None:
        boto3.setup_default_session()
    return boto3.DEFAULT_SESSION


def new_client(service: str, **options: Any) -> Any:
    """A client of the process's session, made with boto3's ``client`` options; not counted."""
    with _making:
        return _session().client(service, **options)


def use_credentials(credentials: Credentials | None) -> Credentials | None:
    """Sign with ``credentials`` the requests of the session's clients made from now on without credentials of
    their own (boto3's ``client`` among them): the session reads the environment's once. None leaves them to the
    session to read again as it next needs them. Returns those it replaces (None where the session had read none)."""
    with _making:
        session = _session()._session
        replaced: Credentials | None = session._credentials
        session._credentials = credentials
        return replaced


# S3's requests are signed with SigV4 (``s3v4``) as botocore signs them by default; its pre-signed URLs too, which
# botocore would otherwise sign with SigV2 (refused by the regions opened since 2014)
SIGNING = {"s3": Config(signature_version="s3v4")}


# cached per endpoint and credentials: a process that starts a second embedded cloud must not reach the first
@cache
def _client(service: str, endpoint: str | None, key_id: str | None, secret: str | None) -> Any:
    config = RETRIES.merge(SIGNING[service]) if service in SIGNING else RETRIES
    made = new_client(
        service, config=config, endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret
    )
    usage.instrument(made)
    return made


@cache
def _resource(service: str, endpoint: str | None, key_id: str | None, secret: str | None) -> Any:
    with _making:
        made = _session().resource(
            service, config=RETRIES, endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret
        )
    usage.instrument(made.meta.client)
    return made


def error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")


def setup_problem(error: BaseException) -> str | None:
    """What the AWS configuration lacks when boto3 cannot call AWS at all (no region, no credentials),
    said as the fix; None for any other error."""
    if isinstance(error, NoRegionError):
        return "no AWS region is set: set AWS_DEFAULT_REGION (or a region in your AWS profile) to the stack's region"
    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return (
            f"{str(error).rstrip('.')}: configure them as for the AWS CLI"
            " (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    return None
