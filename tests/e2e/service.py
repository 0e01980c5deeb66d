"""Driving ``slsml local up`` as a user would, each command its own process: the command, its JSON line, the
variables ``slsml local env`` prints, the service's bucket and run table reached with them, and the service for a
test module's length."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import pytest

from slsml.aws.clients import SIGNING
from slsml.aws.storage import ObjectStore
from slsml.local.service import STATE_HOME_ENV
from slsml.spec import wiring
from slsml.state.runtable import RunTable

SLSML = [sys.executable, "-m", "slsml.cli.main"]


def slsml(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``slsml ARGS`` in ``cwd``, its output captured (lines up to 200 columns)."""
    return subprocess.run(
        [*SLSML, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"}
    )


def last_json(done: subprocess.CompletedProcess) -> dict:
    """The JSON line a ``--json`` command that succeeded printed last."""
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def service_env(cwd: Path) -> dict[str, str]:
    """The variables `slsml local env` exports, read as a shell would."""
    text = slsml(cwd, "local", "env").stdout
    pairs = [shlex.split(line.removeprefix("export "))[0] for line in text.splitlines() if line.startswith("export ")]
    return dict(pair.split("=", 1) for pair in pairs)


def _resource_arguments(env: dict[str, str]) -> dict[str, str]:
    return {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "region_name": env["AWS_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def service_store(cwd: Path) -> ObjectStore:
    """The service's bucket, reached as any AWS client would, with the variables `slsml local env` prints; signing
    with SigV4 as slsml's clients do, its pre-signed URLs (ranged reads) too."""
    env = service_env(cwd)
    return ObjectStore(boto3.client("s3", config=SIGNING["s3"], **_resource_arguments(env)), env["SLSML_BUCKET"])


class Held:
    """``with Held(env, function):`` for the block, the messages sent to ``function``'s queue in the service of ``env``
    (``service_env``) wait ``seconds`` before they are delivered (SQS's ``DelaySeconds``): its runs take no further
    step of it meanwhile, so a command the block runs lands before them however long it takes to start. The client and
    the queue are found when it is made, so that entering the block is one request. The messages held are delivered
    once their delay ends."""

    def __init__(self, env: dict[str, str], function: str, seconds: int = 120) -> None:
        self.sqs = boto3.client("sqs", **_resource_arguments(env))
        (self.url,) = [url for url in self.sqs.list_queues()["QueueUrls"] if url.endswith(f"-{function}")]
        self.seconds = seconds

    def __enter__(self) -> None:
        self.sqs.set_queue_attributes(QueueUrl=self.url, Attributes={"DelaySeconds": str(self.seconds)})

    def __exit__(self, *_: object) -> None:
        self.sqs.set_queue_attributes(QueueUrl=self.url, Attributes={"DelaySeconds": "0"})


def service_table(cwd: Path) -> RunTable:
    """The service's run table, reached as any AWS client would, with the variables `slsml local env` prints."""
    env = service_env(cwd)
    return RunTable(boto3.resource("dynamodb", **_resource_arguments(env)).Table(env[wiring.TABLE_ENV]))


@contextmanager
def local_service(home: Path, *options: str) -> Iterator[dict]:
    """`slsml local up --pool 2 --json` (and ``options``) in ``home`` (its state, as the line it printed), `local down`
    at the end; for its length, the user's state directory (where every command finds the service) is
    ``home/state``."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv(STATE_HOME_ENV, str(home / "state"))
        up = slsml(home, "local", "up", "--pool", "2", "--json", *options)
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            state = json.loads(up.stdout)  # as `local status --json` prints it
            assert f"local service up at {state['deployment']['endpoint']}" in up.stderr  # what it says, beside it
            yield state
        finally:
            slsml(home, "local", "down")
