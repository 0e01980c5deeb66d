"""Usage counted by the clients of ``slsml.aws.clients`` against a moto server: exact requests, units, publishes
and bytes for known calls; scopes and invocations; the CloudWatch reader."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from boto3.dynamodb.conditions import Attr
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from urllib3 import HTTPResponse

from slsml.accounting import usage
from slsml.accounting.prices import PriceTable
from slsml.aws import clients as aws
from slsml.local.cloud import REGION, EmbeddedCloud
from slsml.state import records

BUCKET, TABLE = "usage-bucket", "usage-table"


@pytest.fixture(scope="module")
def cloud() -> Iterator[EmbeddedCloud]:
    server = EmbeddedCloud()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def endpoint(cloud: EmbeddedCloud, monkeypatch: pytest.MonkeyPatch) -> str:
    environment = {
        "AWS_ACCESS_KEY_ID": cloud.credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": cloud.credentials.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": cloud.endpoint,
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return cloud.endpoint


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The usage lines logged during the test (filled as they are logged)."""
    caplog.set_level(logging.INFO, logger=usage.logger.name)
    emitted: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if hasattr(record, usage.USAGE_KEY):
                emitted.append(getattr(record, usage.USAGE_KEY))

    handler = Collect()
    logging.getLogger(usage.logger.name).addHandler(handler)
    yield emitted
    logging.getLogger(usage.logger.name).removeHandler(handler)


def settle(lines: list[dict[str, Any]]) -> None:
    """Log what the test's setup sent outside any scope, and forget that line."""
    with usage.invocation("setup", 128):
        pass
    lines.clear()


def _table(endpoint: str) -> Any:
    dynamodb = aws.resource("dynamodb")
    names = dynamodb.meta.client.list_tables()["TableNames"]
    if TABLE not in names:
        dynamodb.create_table(**records.create_table_arguments(TABLE))
    return dynamodb.Table(TABLE)


def test_a_known_sequence_of_calls_counts_exactly(endpoint: str, lines: list[dict[str, Any]]) -> None:
    s3, sns, table = aws.client("s3"), aws.client("sns"), _table(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    topic = sns.create_topic(Name="usage-topic")["TopicArn"]
    big = "x" * 1500  # an item of 1.5 KB: 2 write units, 1 read unit
    settle(lines)
    with usage.invocation("worker", 3008), usage.scope("run-a", 7):
        s3.put_object(Bucket=BUCKET, Key="runs/a/blob", Body=b"\x01" * 3000)
        assert len(s3.get_object(Bucket=BUCKET, Key="runs/a/blob", Range="bytes=0-99")["Body"].read()) == 100
        s3.get_object(Bucket=BUCKET, Key="runs/a/blob")["Body"].read()
        table.put_item(Item={"pk": "run", "sk": "big", "blob": big})  # moto reports 1
        table.put_item(Item={"pk": "run", "sk": "small", "n": 1})
        assert table.get_item(Key={"pk": "run", "sk": "big"}, ConsistentRead=True)["Item"]["blob"] == big  # moto 0.5
        table.get_item(Key={"pk": "run", "sk": "small"})  # eventually consistent: 0.5
        table.update_item(
            Key={"pk": "run", "sk": "small"}, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1}
        )  # moto reports 0.5 unasked
        with pytest.raises(ClientError):  # a failed conditional write consumes its units
            table.put_item(Item={"pk": "run", "sk": "small", "n": 5}, ConditionExpression=Attr("pk").not_exists())
        assert (
            len(
                table.query(
                    KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": "run"}, ConsistentRead=True
                )["Items"]
            )
            == 2
        )
        entries = [{"Id": "0", "Message": "a"}, {"Id": "1", "Message": "b" * 100_000}, {"Id": "2", "Message": "c"}]
        sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=entries)
    (line,) = lines
    assert line["requests"] == {
        "dynamodb:GetItem": 2,
        "dynamodb:PutItem": 3,
        "dynamodb:Query": 1,
        "dynamodb:UpdateItem": 1,
        "s3:GetObject": 2,
        "s3:PutObject": 1,
        "sns:PublishBatch": 1,
    }
    assert line["write_units"] == 2 + 1 + 1 + 1  # big, small, update, failed condition
    assert line["read_units"] == 1 + 0.5 + 1  # strongly consistent 1.5 KB, eventually consistent, query of 1.5 KB
    assert line["sns_billed"] == 1 + 2 + 1  # 100,000 bytes are two 64 KB chunks
    assert (line["bytes_read"], line["bytes_written"]) == (3100, 3000)
    assert (line["run_id"], line["iteration"], line["function"], line["memory_mb"]) == ("run-a", 7, "worker", 3008)
    assert line["end"] >= line["start"] and line["duration_s"] >= 0
    assert usage.UsageRecord.model_validate(line).requests == line["requests"]


def test_every_attempt_counts(endpoint: str, lines: list[dict[str, Any]]) -> None:
    settle(lines)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    config = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=1)
    s3 = boto3.session.Session().client("s3", endpoint_url=closed, config=config)
    usage.instrument(s3)
    with usage.invocation("merger", 512), usage.scope("run-b", 0), pytest.raises(EndpointConnectionError):
        s3.get_object(Bucket=BUCKET, Key="nothing")
    assert lines[0]["requests"] == {"s3:GetObject": 3}


def test_a_read_by_presigned_url_counts_as_a_get_each_attempt(endpoint: str, lines: list[dict[str, Any]]) -> None:
    """A ranged read by pre-signed URL (``slsml.aws.ranged``) counts as the GetObject it is: a request each attempt,
    a throttled one retried, and the bytes read; within ``usage.warming``, for the run and not the iteration."""
    from slsml.aws.storage import ObjectStore

    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="runs/g/blob", Body=bytes(range(256)) * 40)
    store = ObjectStore(s3, BUCKET)
    throttled: list[str] = []

    def slow_down_once(request: Any, **_: Any) -> AWSResponse | None:
        if throttled or "X-Amz-Signature" not in request.url:  # the pre-signed GETs alone
            return None
        throttled.append(request.url)
        error = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        return AWSResponse(request.url, 503, {}, HTTPResponse(body=io.BytesIO(error), preload_content=False))

    settle(lines)
    s3.meta.events.register("before-send.s3.GetObject", slow_down_once, unique_id="slow-down-once")
    try:
        with usage.invocation("worker", 3008), usage.scope("run-g", 2, worker=1):
            assert store.get_range("runs/g/blob", (10, 109)).body == (bytes(range(256)) * 40)[10:110]
            with usage.warming():
                assert len(store.get_range("runs/g/blob", (0, 49)).body) == 50
    finally:
        s3.meta.events.unregister("before-send.s3.GetObject", unique_id="slow-down-once")
    iteration, warmed = lines
    assert len(throttled) == 1
    assert (iteration["iteration"], iteration["requests"], iteration["bytes_read"]) == (2, {"s3:GetObject": 2}, 100)
    assert (warmed["iteration"], warmed["requests"], warmed["bytes_read"]) == (None, {"s3:GetObject": 1}, 50)

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    config = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=1)
    unreachable = ObjectStore(boto3.session.Session().client("s3", endpoint_url=closed, config=config), BUCKET)
    lines.clear()
    with usage.invocation("worker", 3008), usage.scope("run-g", 3), pytest.raises(EndpointConnectionError):
        unreachable.get_range("runs/g/blob", (0, 9))
    assert lines[0]["requests"] == {"s3:GetObject": 3}


def test_requests_outside_a_scope_go_to_the_next_one_and_scopes_split_the_invocation(
    endpoint: str, lines: list[dict[str, Any]]
) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    settle(lines)
    s3.list_objects_v2(Bucket=BUCKET)  # outside any invocation (a cold start's import): for the next scope
    with usage.invocation("reducer", 1769):
        s3.head_bucket(Bucket=BUCKET)  # before the first scope
        with usage.scope("run-c", 1):
            s3.put_object(Bucket=BUCKET, Key="runs/c/1", Body=b"1")
        with usage.scope("run-c", 2):
            s3.put_object(Bucket=BUCKET, Key="runs/c/2", Body=b"22")
    with usage.invocation("reducer", 1769):  # no scope, e.g. a rejected message: its own line, of no run
        s3.head_bucket(Bucket=BUCKET)
    first, second, unattributed = lines
    assert first["requests"] == {"s3:ListObjectsV2": 1, "s3:HeadBucket": 1, "s3:PutObject": 1}
    assert (second["iteration"], second["requests"], second["bytes_written"]) == (2, {"s3:PutObject": 1}, 2)
    assert second["start"] == first["end"]  # a message's time runs from the end of the one before it
    assert (unattributed["run_id"], unattributed["requests"]) == (None, {"s3:HeadBucket": 1})


def test_what_fills_the_warm_cache_counts_for_the_run_and_not_its_iteration(
    endpoint: str, lines: list[dict[str, Any]]
) -> None:
    """A container's first read of a run's config is the run's, whichever iteration brings the run there: a line of
    no iteration and no duration, beside the iteration's, and the spend so far counts both."""
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="runs/d/run.json", Body=b"{}")
    settle(lines)
    with usage.invocation("worker", 3008), usage.scope("run-d", 0, worker=1):
        with usage.warming():
            s3.get_object(Bucket=BUCKET, Key="runs/d/run.json")["Body"].read()
        s3.get_object(Bucket=BUCKET, Key="runs/d/run.json", Range="bytes=0-0")["Body"].read()
        assert usage.so_far(PriceTable(s3_get=1.0, lambda_gb_second=0.0, lambda_request=0.0)) == 2.0
    iteration, warmed = lines
    assert (iteration["iteration"], iteration["requests"], iteration["bytes_read"]) == (0, {"s3:GetObject": 1}, 1)
    assert (warmed["run_id"], warmed["iteration"], warmed["requests"], warmed["bytes_read"]) == (
        "run-d",
        None,
        {"s3:GetObject": 1},
        2,
    )
    assert warmed["duration_s"] == 0 and warmed["start"] == warmed["end"] == iteration["end"]
    figures = usage.figures([usage.UsageRecord.model_validate(line) for line in lines], 1, PriceTable())
    assert figures["requests_per_iteration"] == {"s3:GetObject": 1}
    assert figures["cost_by_service_usd"]["s3"] == pytest.approx(2 * PriceTable().s3_get)


def test_a_cached_splits_shards_are_read_once_for_the_run_and_not_for_an_iteration(
    endpoint: str, lines: list[dict[str, Any]]
) -> None:
    """A split within the warm cache is read by whole shards once per container: those reads are the run's, and a
    later batch of the same shards reads nothing."""
    import numpy as np

    from slsml.aws.cache import LRUCache
    from slsml.aws.storage import ObjectStore
    from slsml.data import datasets as data

    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    store = ObjectStore(s3, BUCKET)
    x, y = np.arange(400, dtype=np.float32).reshape(100, 4), np.arange(100) % 3
    data.put_dataset(store, "few", x, y, x[:10], y[:10], shard_mb=0.0005)  # shards of a few records
    reader = data.DatasetReader(store, data.load_manifest(store, "few"), LRUCache(None))
    settle(lines)
    with usage.invocation("worker", 3008):
        with usage.scope("run-e", 3, worker=0):
            first, _ = reader.take("train", np.arange(0, 100, 7))
        with usage.scope("run-e", 4, worker=0):
            again, _ = reader.take("train", np.arange(1, 100, 7))
    iteration, warmed, later = lines
    assert "s3:GetObject" not in iteration["requests"] and "s3:GetObject" not in later["requests"]
    shards = len(reader.manifest.train.shards)  # a batch of every 7th sample touches each of them
    assert shards > 1
    assert (warmed["run_id"], warmed["iteration"], warmed["requests"]) == ("run-e", None, {"s3:GetObject": shards})
    assert np.array_equal(first, x[::7]) and np.array_equal(again, x[1::7])


def test_a_dropped_model_scope_is_named_by_its_step(endpoint: str, lines: list[dict[str, Any]]) -> None:
    settle(lines)
    with usage.invocation("run_starter", 3008), usage.scope(None, None):
        usage.attribute("model-1234abcd")
    assert (lines[0]["run_id"], lines[0]["iteration"]) == ("model-1234abcd", None)


def test_a_scope_says_which_part_of_its_iteration_the_message_was(endpoint: str, lines: list[dict[str, Any]]) -> None:
    from slsml.spec.messages import Deadline, ReduceDone, WorkMessage

    settle(lines)
    messages = [
        WorkMessage(run_id="r", iteration=3, worker=2, workers=3, attempt=1),
        ReduceDone(run_id="r", iteration=3, shard=0),
        Deadline(run_id="r", iteration=3, stage="work", round=0, due_at=0.0),
    ]
    with usage.invocation("worker", 3008):
        for message in messages:
            with usage.scope(message.run_id, message.iteration, **usage.about(message)):
                pass
    work, done, deadline = lines
    assert (work["worker"], work["attempt"], "shard" in work, "stage" in work) == (2, 1, False, False)
    assert (done["shard"], "worker" in done) == (0, False) and deadline["stage"] == "work"
    entry = {"function_request_id": "req-1", "xray_trace_id": "1-abc-def", usage.USAGE_KEY: work}
    record = usage._record(json.dumps(entry), "r")
    assert (record.worker, record.shard, record.invocation, record.trace_id) == (2, None, "req-1", "1-abc-def")


def test_cloudwatch_reader_returns_the_runs_usage_lines(cloud: EmbeddedCloud, endpoint: str) -> None:
    logs = cloud.client("logs")
    groups = {"/aws/lambda/Slsml-Worker": "worker", "/aws/lambda/Slsml-Merger": "merger"}
    now_ms = int(time.time() * 1000)

    def line(function: str, run_id: str, iteration: int | None, request_id: str) -> str:
        record = {
            "run_id": run_id,
            "iteration": iteration,
            "function": function,
            "start": 100.0,
            "end": 100.5,
            "duration_s": 0.5,
            "memory_mb": 3008,
            "requests": {"s3:GetObject": 2},
            "read_units": 0.0,
            "write_units": 1.0,
            "sns_billed": 1,
            "bytes_read": 10,
            "bytes_written": 20,
        }
        return json.dumps({"level": "INFO", "message": "usage", "function_request_id": request_id, "usage": record})

    for group, function in groups.items():
        logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName="2026/01/01/[$LATEST]abc")
        messages = [
            line(function, "run-d", 0, f"{function}-1"),
            line(function, "run-d", 1, f"{function}-2"),
            line(function, "run-e", 0, f"{function}-3"),  # another run
            json.dumps({"level": "INFO", "message": "run-d merged", "run_id": "run-d"}),  # no usage
            "START RequestId: 1 Version: $LATEST",
        ]
        logs.put_log_events(
            logGroupName=group,
            logStreamName="2026/01/01/[$LATEST]abc",
            logEvents=[{"timestamp": now_ms + i, "message": m} for i, m in enumerate(messages)],
        )
    records = usage.read_cloudwatch(logs, groups, "run-d", since=now_ms / 1000 - 60)
    assert sorted((r.function, r.iteration, r.invocation) for r in records) == [
        ("merger", 0, "merger-1"),
        ("merger", 1, "merger-2"),
        ("worker", 0, "worker-1"),
        ("worker", 1, "worker-2"),
    ]
    assert all(r.run_id == "run-d" and r.requests == {"s3:GetObject": 2} for r in records)
    assert usage.read_cloudwatch(logs, groups, "run-d", since=now_ms / 1000 + 60) == []  # after the lines


def test_a_scopes_dollars_so_far_are_its_line_priced_without_the_time_after(
    endpoint: str, lines: list[dict[str, Any]]
) -> None:
    from slsml.accounting import prices

    s3, table = aws.client("s3"), _table(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    price_table = prices.PriceTable()
    settle(lines)
    with usage.invocation("worker", 3008):
        with usage.scope("run-f", 0):
            s3.put_object(Bucket=BUCKET, Key="runs/f/0", Body=b"\x01" * 100)
            table.update_item(
                Key={"pk": "run", "sk": "spend"}, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1}
            )
            first = usage.so_far(price_table)
            assert usage.scope_run() == "run-f"
        with usage.scope("run-f", 1):
            s3.get_object(Bucket=BUCKET, Key="runs/f/0")["Body"].read()
            second = usage.so_far(price_table)
    assert usage.scope_run() is None
    one, two = (usage.UsageRecord.model_validate(line) for line in lines)

    def priced(record: usage.UsageRecord) -> float:
        return sum(usage.cost([record], price_table).values())

    # the requests and units as logged, and the invocation's request once (with its first scope); the line's
    # duration runs on to the scope's end
    assert priced(one.model_copy(update={"duration_s": 0.0})) <= first <= priced(one)
    request = price_table.lambda_request
    assert priced(two.model_copy(update={"duration_s": 0.0})) - request <= second <= priced(two) - request
    assert first > price_table.s3_put > 0 and second > price_table.s3_get
