"""The functions' own usage lines against the embedded cloud's request log (moto's recorder): every
request a function sent, by function and ``service:Operation``, is in its usage lines, and nothing
else is. The request log holds the host's polling and the test's and the state machine's calls too:
those carry no ``app/slsml-<function>`` in their User-Agent and are left out of the comparison."""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from slsml.accounting import usage
from slsml.client import demo, runs
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.training import modelio

RUN = "usage-recorded"
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=3, eval_every=0)
_APP = re.compile(r"\bapp/slsml-(\w+)")
_SERVICE = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/")
_BLANK = re.compile(r"\s*")


def _recorder(local: LocalRuntime, action: str) -> str:
    method = "GET" if action.startswith("download") else "POST"
    return local.cloud.call(method, f"/moto-api/recorder/{action}").decode()


def _entries(recording: str) -> list[dict[str, Any]]:
    """The recorded requests. Concurrent requests may share a line (the recorder writes an entry and
    its newline apart), so the log is read as a stream of JSON objects."""
    decoder, entries, position = json.JSONDecoder(), [], 0
    while (position := _BLANK.match(recording, position).end()) < len(recording):
        entry, position = decoder.raw_decode(recording, position)
        entries.append(entry)
    return entries


def _operation(entry: dict[str, Any]) -> str:
    """``service:Operation`` of a recorded request, as botocore names it."""
    headers = {name.lower(): value for name, value in entry["headers"].items()}
    service = _SERVICE.search(headers["authorization"]).group(1)
    if "x-amz-target" in headers:  # JSON protocols: DynamoDB, SQS, Step Functions
        return f"{service}:{headers['x-amz-target'].rsplit('.', 1)[1]}"
    if service != "s3":  # query protocol: SNS
        body = base64.b64decode(entry["body"]).decode() if entry["body_encoded"] else entry["body"]
        return f"{service}:{parse_qs(body)['Action'][0]}"
    url = urlparse(entry["url"])
    has_key = "/" in url.path.strip("/")
    method = entry["method"]
    if method == "GET":
        return "s3:GetObject" if has_key else "s3:ListObjectsV2"
    if method == "HEAD":
        return "s3:HeadObject" if has_key else "s3:HeadBucket"
    if method == "PUT" and has_key:
        return "s3:CopyObject" if "x-amz-copy-source" in headers else "s3:PutObject"
    if method == "POST" and not has_key and "delete" in parse_qs(url.query, keep_blank_values=True):
        return "s3:DeleteObjects"
    return f"s3:{method} {url.path}"


def test_the_functions_count_every_request_they_send(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTO_ENABLE_RECORDING", "True")
    monkeypatch.setenv("MOTO_RECORDER_FILEPATH", str(tmp_path / "recording"))
    log_dir = tmp_path / "logs"
    with LocalRuntime(workers=2, reducers=2, log_dir=log_dir) as local:
        services = local.services
        data.put_dataset(services.store, "digits", *demo.digits())
        _recorder(local, "reset-recording")
        _recorder(local, "start-recording")
        launch.start_run(services, modelio.save_model(demo.digits_cnn(seed=1)), "digits", SPEC, run_id=RUN)
        run = runs.wait_for_run(services, RUN, timeout_s=300)
        assert run.status == "COMPLETED", run.reason
        assert local.host.drain(timeout_s=60)  # no request of a function is still to come
        iterations = services.table.list_iterations(RUN)
        recorded = Counter()
        for entry in _entries(_recorder(local, "download-recording")):
            function = _APP.search(entry["headers"].get("User-Agent", ""))
            if function:
                recorded[function.group(1), _operation(entry)] += 1

    lines = [
        json.loads(line)[usage.USAGE_KEY]
        for path in log_dir.glob("*.log")
        for line in path.read_text().splitlines()
        if line.startswith("{") and f'"{usage.USAGE_KEY}"' in line
    ]
    counted = Counter()
    for line in lines:
        counted.update({(line["function"], operation): n for operation, n in line["requests"].items()})
    assert counted == recorded
    assert {"worker", "reducer", "merger", "reduce_launcher", "work_launcher"} <= {f for f, _ in recorded}
    assert recorded["worker", "s3:PutObject"] >= SPEC.workers * SPEC.iterations
    assert recorded["merger", "s3:DeleteObjects"] == SPEC.iterations - 1  # the state each merge superseded
    assert all(line["memory_mb"] == DEFAULT_FUNCTIONS[line["function"]].memory_mb for line in lines)

    records = usage.read_local(log_dir, RUN)
    assert {r.function for r in records} == {f for f, _ in recorded}
    summary = runs.summarize(run, iterations, 0.0, records)
    per_iteration = summary.requests_per_iteration
    assert per_iteration["s3:GetObject"] > 0 and per_iteration["s3:PutObject"] > 0
    assert per_iteration["sns:PublishBatch"] > 0 and per_iteration["dynamodb:UpdateItem"] > 0
    assert summary.gb_seconds > 0 and summary.cost_by_service_usd.keys() >= {"lambda", "s3", "sns", "dynamodb"}
    assert 0 < summary.cost_per_iteration_usd < summary.cost_usd
