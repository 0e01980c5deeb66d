"""The embedded cloud is local: it listens on loopback alone, refuses what a web page sends (a foreign
``Origin``, a cross-site fetch, a rebound host name) with no CORS header, moto's management endpoints
included; it answers requests signed with its own credentials alone, whatever client sends them; and the local
service acts on its state file only if the file's pid, endpoint and credentials are its own."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from slsml.local import service
from slsml.local.cloud import EmbeddedCloud, signed

EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def cloud() -> Iterator[EmbeddedCloud]:
    started = EmbeddedCloud()
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _send(cloud: EmbeddedCloud, method: str, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", cloud.port, timeout=10)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_what_a_web_page_sends_is_refused_and_changes_nothing(cloud: EmbeddedCloud) -> None:
    s3 = cloud.client("s3")
    s3.create_bucket(Bucket="kept")
    page = {"Origin": EVIL}
    attempts = [
        ("GET", "/moto-api/data.json", page),  # read every run's state
        ("POST", "/moto-api/reset", page),  # wipe it
        ("OPTIONS", "/kept", page | {"Access-Control-Request-Method": "DELETE"}),  # the preflight of a fetch
        ("GET", "/", page),  # list the buckets
        ("POST", "/moto-api/reset", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}),  # a form
        ("GET", "/moto-api/data.json", {"Host": f"evil.example:{cloud.port}"}),  # a DNS-rebinding page
    ]
    for method, path, headers in attempts:
        status, answered, body = _send(cloud, method, path, **headers)
        assert status == 403, (method, path, headers, status, body)
        assert not any(name.startswith("access-control-") for name in answered), answered
        assert b"refused" in body or b"answers requests for 127.0.0.1" in body, body
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["kept"]  # nothing was reset
    own = {"Origin": f"http://127.0.0.1:{cloud.port}"}
    status, _, body = _send(
        cloud, "GET", "/moto-api/data.json", **own, **_signature(cloud, "GET", "/moto-api/data.json")
    )
    assert status == 200 and b"kept" in body  # its own origin and AWS clients are served, signed


def _signature(cloud: EmbeddedCloud, method: str, path: str, credentials: Credentials | None = None) -> dict[str, str]:
    """The headers that sign a request for ``path`` with ``credentials`` (the cloud's own by default)."""
    request = signed(method, f"{cloud.endpoint}{path}", credentials or cloud.credentials)
    return dict(request.header_items())


def test_only_requests_signed_with_its_credentials_are_answered(cloud: EmbeddedCloud) -> None:
    s3 = cloud.client("s3")
    s3.create_bucket(Bucket="private")
    s3.put_object(Bucket="private", Key="runs/r/run.json", Body=b"{}")
    other = Credentials(cloud.credentials.access_key, "not-the-secret")
    attempts = [  # what another user of the machine could send: (method, path, headers, S3 or not, error code)
        ("GET", "/private?list-type=2", {}, True, "AccessDenied"),  # list the bucket
        ("GET", "/private/runs/r/run.json", {}, True, "AccessDenied"),
        ("PUT", "/private/incoming/x.keras", {}, True, "AccessDenied"),  # start a run
        ("GET", "/moto-api/data.json", {}, False, "MissingAuthenticationTokenException"),  # every run's state
        ("POST", "/moto-api/reset", {}, False, "MissingAuthenticationTokenException"),  # wipe it
        (
            "GET",
            "/moto-api/data.json",
            _signature(cloud, "GET", "/moto-api/data.json", other),
            False,
            "InvalidSignatureException",
        ),
        (
            "GET",
            "/private?list-type=2",
            _signature(cloud, "GET", "/private?list-type=1"),
            False,
            "InvalidSignatureException",
        ),
        (
            "GET",
            "/slsml/owner",
            _signature(cloud, "GET", "/slsml/owner", Credentials("AKIDOTHER", "x")),
            False,
            "UnrecognizedClientException",
        ),
        (  # a function's credentials: its requests are answered as its role's, but it manages nothing
            "POST",
            "/moto-api/reset",
            _signature(cloud, "POST", "/moto-api/reset", cloud.identities["worker"]),
            False,
            "AccessDeniedException",
        ),
    ]
    for method, path, headers, s3_error, code in attempts:
        status, answered, body = _send(cloud, method, path, **headers)
        assert status == 403, (method, path, status, body)
        assert (f"<Code>{code}</Code>" if s3_error else f'"__type": "{code}"') in body.decode(), body
        assert not any(name.startswith("access-control-") for name in answered), answered
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="private")["Contents"]] == ["runs/r/run.json"]
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["kept", "private"]  # nothing was reset


def test_aws_clients_with_other_credentials_are_refused(cloud: EmbeddedCloud) -> None:
    def client(service: str, key_id: str, secret: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=cloud.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(retries={"total_max_attempts": 1}, signature_version="s3v4" if service == "s3" else None),
        )

    own = cloud.credentials
    refused = {
        "s3": (lambda s3: s3.list_buckets(), "SignatureDoesNotMatch"),
        "dynamodb": (lambda dynamodb: dynamodb.list_tables(), "InvalidSignatureException"),
        "sqs": (lambda sqs: sqs.list_queues(), "InvalidSignatureException"),
        "sns": (lambda sns: sns.list_topics(), "InvalidSignature"),
    }
    for service_name, (call, code) in refused.items():
        with pytest.raises(ClientError) as raised:
            call(client(service_name, own.access_key, "guessed"))
        assert raised.value.response["Error"]["Code"] == code
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with pytest.raises(ClientError, match="not this local cloud's"):
            call(client(service_name, "AKIAIOSFODNN7EXAMPLE", own.secret_key))
        call(client(service_name, own.access_key, own.secret_key))  # its own credentials are answered
    s3 = client("s3", own.access_key, own.secret_key)  # signing its pre-signed URLs with SigV4, as slsml's clients do
    url = s3.generate_presigned_url("list_objects_v2", Params={"Bucket": "kept"}, ExpiresIn=60)
    assert urllib.request.urlopen(url, timeout=10).status == 200  # a pre-signed URL, as the workers read samples
    tampered = url.replace("list-type=2", "list-type=2&prefix=runs")
    with pytest.raises(urllib.error.HTTPError) as raised_http:
        urllib.request.urlopen(tampered, timeout=10)
    assert raised_http.value.code == 403 and b"SignatureDoesNotMatch" in raised_http.value.read()


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as the kernel lists them) of the TCP sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, at = local.partition(":")
            if state == "0A" and int(at, 16) == port:
                found.add(address)
    return found


def test_it_listens_on_loopback_alone(cloud: EmbeddedCloud) -> None:
    assert _listening(cloud.port) == {"0100007F"}  # 127.0.0.1, and no other address of the machine


@pytest.fixture(scope="module")
def deployment(cloud: EmbeddedCloud) -> dict:
    return dataclasses.asdict(cloud.provision("state"))


def _write_state(state_dir: Path, pid: int, endpoint: str, deployment: dict) -> Path:
    deployment = deployment | {"endpoint": endpoint}
    state = service.ServiceState(pid=pid, started_at=time.time(), pool=1, log_dir=str(state_dir), deployment=deployment)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / service.STATE_FILE
    path.write_text(json.dumps(state.model_dump()))
    return path


def test_a_state_file_naming_another_process_or_endpoint_is_not_acted_on(
    cloud: EmbeddedCloud, deployment: dict, tmp_path: Path
) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        forged = [
            (bystander.pid, cloud.endpoint),  # a live process whose cloud this is not
            (bystander.pid, f"http://evil.example:{cloud.port}"),  # an endpoint off this machine
            (bystander.pid, "http://127.0.0.1:1"),
        ]  # nothing serves there
        for pid, endpoint in forged:
            path = _write_state(tmp_path / "forged", pid, endpoint, deployment)
            assert service.down(tmp_path / "forged") is False
            assert not path.exists()  # stale: removed, and nothing acted on it
            assert bystander.poll() is None  # `local down` did not signal it
        with pytest.raises(service.NotFoundError, match="no local service is up"):
            _write_state(tmp_path / "forged", bystander.pid, cloud.endpoint, deployment)
            service.connect(tmp_path / "forged")
    finally:
        bystander.kill()
        bystander.wait()
    own = _write_state(tmp_path / "own", os.getpid(), cloud.endpoint, deployment)  # this process owns this cloud
    assert service.status(tmp_path / "own").pid == os.getpid() and own.exists()
