"""The embedded cloud is local: it listens on loopback alone, refuses what a web page sends (a foreign
``Origin``, a cross-site fetch, a rebound host name) with no CORS header, moto's management endpoints
included; and the local service acts on its state file only if the file's pid and endpoint are its own."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slsml.local import service
from slsml.local.cloud import EmbeddedCloud

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
    status, _, body = _send(cloud, "GET", "/moto-api/data.json", Origin=f"http://127.0.0.1:{cloud.port}")
    assert status == 200 and b"kept" in body  # its own origin (moto's dashboard) and AWS clients are served


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
