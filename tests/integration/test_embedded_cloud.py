"""Embedded clouds are isolated (two alive in one process hold their own resources), enforce the deployed bucket's
policy as S3 does, apply concurrent writes as the services do, serve over kept-alive connections what moto's own
server would, answer SQS long polls as SQS does, and end with the process that started them."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from slsml.aws import clients as aws
from slsml.aws.ranged import RangedReads
from slsml.aws.storage import MULTIPART_BYTES, ObjectStore, etag_of
from slsml.local.cloud import EmbeddedCloud, LocalDeployment, bucket_policy, signed
from slsml.spec import keys, wiring
from slsml.spec.errors import SlsmlError
from tests.processes import left_running


def test_two_clouds_in_one_process_do_not_share_state(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = EmbeddedCloud(), EmbeddedCloud()
    first.start()
    second.start()
    try:
        one = first.provision()
        two = second.provision()  # the same names: would collide if the clouds shared state
        _use(monkeypatch, one)
        aws.client("s3").put_object(Bucket=one.bucket, Key="runs/x/run.json", Body=b"{}", IfNoneMatch="*")
        _use(monkeypatch, two)  # the cached clients must now reach the second cloud
        assert aws.client("s3").list_objects_v2(Bucket=two.bucket).get("KeyCount", 0) == 0
        sns = second.client("sns")
        topics = {t["TopicArn"].rsplit("-", 1)[-1] for t in sns.list_topics()["Topics"]}
        assert topics == {t.name for t in wiring.TOPICS}
        sqs = second.client("sqs")
        queued = [fn for fn in wiring.FUNCTIONS if not fn.reads_dead_letters]  # the reader takes the DLQs'
        assert len(sqs.list_queues()["QueueUrls"]) == 2 * len(queued)  # one queue + DLQ each
    finally:
        first.stop()
        second.stop()


def _use(monkeypatch: pytest.MonkeyPatch, deployment: LocalDeployment) -> None:
    """What ``use_deployment`` does, undone after the test."""
    for name, value in deployment.environment().items():
        monkeypatch.setenv(name, value)


def _refused(write: Callable[[], object]) -> str:
    """The error code S3 answers ``write`` with."""
    with pytest.raises(ClientError) as refused:
        write()
    return refused.value.response["Error"]["Code"]


def _multipart(s3: Any, bucket: str, key: str, body: bytes, completion: dict[str, str]) -> None:
    """Store ``body`` at ``key`` as a multipart upload of one part, completed with ``completion``'s parameters."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=parts, **completion)


def test_the_bucket_refuses_what_the_deployed_policy_refuses() -> None:
    """The bucket holds the stack's policy statements, and a write under runs/ that they deny is refused (403
    AccessDenied), as S3 refuses it: a PutObject without If-None-Match, a copy, a multipart upload's completion
    without it. A create-only PutObject or multipart upload is stored, and nothing stored is overwritten. A policy
    the server could not enforce is refused."""
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        bucket = cloud.provision().bucket
        s3 = cloud.client("s3")
        installed = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
        assert installed == bucket_policy(bucket)

        update, config = keys.update("r", 1, 0, attempt=1), keys.run_config("r")
        with pytest.raises(ClientError) as plain:
            s3.put_object(Bucket=bucket, Key=update, Body=b"first")
        assert plain.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert plain.value.response["Error"]["Code"] == "AccessDenied"
        assert not s3.list_objects_v2(Bucket=bucket, Prefix="runs/").get("Contents")
        s3.put_object(Bucket=bucket, Key=update, Body=b"first", IfNoneMatch="*")
        assert _refused(lambda: s3.put_object(Bucket=bucket, Key=update, Body=b"second")) == "AccessDenied"
        assert (
            _refused(lambda: s3.put_object(Bucket=bucket, Key=update, Body=b"second", IfNoneMatch="*"))
            == "PreconditionFailed"
        )
        assert s3.get_object(Bucket=bucket, Key=update)["Body"].read() == b"first"
        source = {"Bucket": bucket, "Key": update}
        assert _refused(lambda: s3.copy_object(Bucket=bucket, Key=config, CopySource=source)) == "AccessDenied"
        # a multipart upload starts and sends its parts unconditioned; its completion creates the object: refused
        # without If-None-Match, stored with it
        assert _refused(lambda: _multipart(s3, bucket, config, b"{}", {})) == "AccessDenied"
        assert not s3.list_objects_v2(Bucket=bucket, Prefix=keys.run_prefix("r") + "run").get("Contents")
        _multipart(s3, bucket, config, b"{}", {"IfNoneMatch": "*"})
        assert s3.get_object(Bucket=bucket, Key=config)["Body"].read() == b"{}"
        assert _refused(lambda: _multipart(s3, bucket, config, b"[]", {"IfNoneMatch": "*"})) == "PreconditionFailed"
        # ObjectStore's multipart create onto an existing key stores nothing and leaves what is there
        store = ObjectStore(s3, bucket)
        stored = s3.head_object(Bucket=bucket, Key=update)["ETag"]
        assert store.create(update, b"2" * (MULTIPART_BYTES + 1)) is None
        assert s3.head_object(Bucket=bucket, Key=update)["ETag"] == stored
        assert s3.get_object(Bucket=bucket, Key=update)["Body"].read() == b"first"
        big = keys.update("r", 1, 1, attempt=1)
        data = b"3" * (MULTIPART_BYTES + 1)
        assert store.create(big, data) == etag_of(data, 3) == s3.head_object(Bucket=bucket, Key=big)["ETag"]
        assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=keys.run_prefix("r") + "iters/").get("Uploads")

        model = keys.model("r", 1)  # a kind the policy leaves out: written however it is sent, copied too
        s3.put_object(Bucket=bucket, Key=model, Body=b"model")
        s3.copy_object(Bucket=bucket, Key=model, CopySource=source)
        assert s3.get_object(Bucket=bucket, Key=model)["Body"].read() == b"first"

        # deletes under runs/: each function deletes the kinds its wiring says it deletes, the owner none
        assert _refused(lambda: s3.delete_object(Bucket=bucket, Key=model)) == "AccessDenied"
        with pytest.raises(SlsmlError, match=re.escape(f"s3://{bucket}/{update} was not deleted: AccessDenied")):
            store.delete([update])
        worker, merger = (ObjectStore(cloud.client("s3", function), bucket) for function in ("worker", "merger"))
        with pytest.raises(SlsmlError, match="was not deleted"):
            worker.delete([model])
        worker.delete([update])
        merger.s3.delete_object(Bucket=bucket, Key=model)
        assert {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="runs/")["Contents"]} == {config, big}
        s3.put_object(Bucket=bucket, Key=keys.dataset_manifest("d"), Body=b"{}")
        s3.delete_object(Bucket=bucket, Key=keys.dataset_manifest("d"))  # datasets are the owner's to delete

        statement = {**installed["Statement"][0], "Condition": {"StringEquals": {"s3:if-none-match": "*"}}}
        other = json.dumps({**installed, "Statement": [statement]})
        assert _refused(lambda: s3.put_bucket_policy(Bucket=bucket, Policy=other)) == "MalformedPolicy"
        assert json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"]) == installed
    finally:
        cloud.stop()


def test_concurrent_adds_to_one_item_are_all_counted() -> None:
    """A barrier's counter is an UpdateItem ADD from every report at once: DynamoDB counts each one."""
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        table = cloud.provision().table
        threads, adds = 16, 250
        key = {"pk": {"S": "RUN#race"}, "sk": {"S": "ITER#0"}}

        def add() -> None:
            dynamodb = cloud.client("dynamodb")  # one per thread, as each function process has its own
            for _ in range(adds):
                dynamodb.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression="ADD arrived :one",
                    ExpressionAttributeValues={":one": {"N": "1"}},
                )

        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(add) for _ in range(threads)]:
                done.result()
        item = cloud.client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
        assert int(item["arrived"]["N"]) == threads * adds
    finally:
        cloud.stop()


def test_the_server_keeps_connections_and_s3s_names_as_sent() -> None:
    """Every client's connection is reused, however many idle at once; S3 metadata keys with underscores
    and object keys with escaped characters come back as they were stored."""
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        # more connections than cheroot keeps idle by default (10), each idling while the others are served
        connections = [http.client.HTTPConnection("127.0.0.1", cloud.port, timeout=10) for _ in range(40)]
        sockets: list[list[object]] = [[] for _ in connections]
        for _ in range(3):
            for used, connection in zip(sockets, connections, strict=True):
                state = signed("GET", f"{cloud.endpoint}/moto-api/data.json", cloud.credentials)
                connection.request("GET", "/moto-api/data.json", headers=dict(state.header_items()))
                response = connection.getresponse()
                response.read()
                assert response.status == 200 and response.getheader("Connection") != "close"
                used.append(connection.sock)
        for connection in connections:
            connection.close()
        assert all(used[0] is not None and used == [used[0]] * 3 for used in sockets)
        s3 = cloud.client("s3")
        s3.create_bucket(Bucket="names")
        metadata = {"slsml-update": "1/dense/3", "user_key": "kept"}
        stored = ["plain", "with space+plus%25", "a//double"]
        for key in stored:
            s3.put_object(Bucket="names", Key=key, Body=key.encode(), Metadata=metadata)
            assert s3.head_object(Bucket="names", Key=key)["Metadata"] == metadata
            assert s3.get_object(Bucket="names", Key=key)["Body"].read() == key.encode()
        assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket="names")["Contents"]) == sorted(stored)
    finally:
        cloud.stop()


def ranged_answers(s3: object) -> list[object]:
    """What ``s3`` answers to ranged GETs: of a dataset shard past 5 MB (the server answers these directly) and of
    what it leaves to moto (another key's form, a versioned object, the whole object, open and suffix ranges, bad
    ranges, missing objects, a condition)."""
    body = np.random.default_rng(0).bytes(6 * 2**20 + 777)
    shard, odd = "datasets/d/train/00000/shard.bin", "with space+plus%25"
    s3.create_bucket(Bucket="ranges")
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    for bucket, key in (("ranges", shard), ("ranges", odd), ("versioned", shard), ("versioned", odd)) * 2:
        s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sha256": "ab" * 32})
    ranges = ["bytes=0-0", "bytes=1000-2999", f"bytes={len(body) - 10}-{len(body) + 50}", f"bytes=0-{len(body) - 1}"]
    ranges += ["bytes=-100", "bytes=100-", "bytes=5-2", f"bytes={len(body)}-{len(body) + 1}"]
    asked = [(bucket, key, r, {}) for bucket in ("ranges", "versioned") for key in (shard, odd) for r in ranges]
    asked += [("ranges", "missing", "bytes=0-9", {}), ("gone", shard, "bytes=0-9", {})]
    asked += [("ranges", shard, "bytes=0-9", {"IfMatch": '"other"'})]
    out: list[object] = []
    for bucket, key, byte_range, how in asked:
        try:
            got = s3.get_object(Bucket=bucket, Key=key, Range=byte_range, **how)
        except ClientError as error:
            out.append([bucket, key, byte_range, error.response["Error"]["Code"]])
            continue
        head = s3.head_object(Bucket=bucket, Key=key)
        read = got["Body"].read()
        first, last = map(int, got.get("ContentRange", f"bytes 0-{len(body) - 1}/").split()[1].split("/")[0].split("-"))
        fields = ("ContentRange", "ContentLength", "ContentType", "AcceptRanges", "Metadata", "ChecksumCRC32")
        out.append(
            [bucket, key, byte_range, read == body[first : last + 1], len(read)]
            + [got.get(name) for name in fields]
            + [got["ETag"] == head["ETag"], got["LastModified"] == head["LastModified"]]
            + [got.get("VersionId") == head.get("VersionId"), "VersionId" in got]
        )
    return out


def answers_in_moto_and_the_embedded_cloud(
    monkeypatch: pytest.MonkeyPatch, answers: Callable[[object], list[object]]
) -> list[object]:
    """What ``answers`` gives against moto's in-process mock, checked equal to what it gives against the embedded
    cloud."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        expected = answers(boto3.client("s3", region_name="us-east-1"))
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        assert answers(cloud.client("s3")) == expected
    finally:
        cloud.stop()
    return expected


def test_ranged_gets_answer_as_moto_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answers a plain ranged GET itself, with moto's answer; moto answers the rest."""
    expected = answers_in_moto_and_the_embedded_cloud(monkeypatch, ranged_answers)
    assert [a[3] for a in expected if a[2] == "bytes=1000-2999"] == [True] * 4  # the bytes asked for, each time
    assert {a[3] for a in expected if len(a) == 4} == {
        "InvalidRange",
        "NoSuchKey",
        "NoSuchBucket",
        "PreconditionFailed",
    }


def ranged_reads(s3: object) -> list[object]:
    """What reads by pre-signed URL (``RangedReads``) of byte ranges answer: the bytes or the error's code, each
    checked against what a ranged GetObject of ``s3`` answers."""
    body = np.random.default_rng(1).bytes(6 * 2**20 + 777)
    shard, odd = "datasets/d/train/00000/shard.bin", "with space+plus%25"
    s3.create_bucket(Bucket="presigned")
    for key in (shard, odd):
        s3.put_object(Bucket="presigned", Key=key, Body=body)
    size = len(body)
    ranges = [(0, 0), (1000, 2999), (size - 10, size + 50), (0, size - 1), (5, 2), (size, size + 1)]
    asked = [("presigned", key, r) for key in (shard, odd) for r in ranges]
    asked += [("presigned", "missing", (0, 9)), ("gone", shard, (0, 9))]

    def outcome(read: Callable[[], object]) -> object:
        try:
            return read()
        except ClientError as error:
            return error.response["Error"]["Code"]

    def by_call(bucket: str, key: str, first: int, last: int) -> tuple[bytes, str]:
        """The bytes, with the object's ETag (the one a read by URL answers with too)."""
        answer = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")
        return answer["Body"].read(), answer["ETag"]

    out: list[object] = []
    for bucket, key, (first, last) in asked:
        by_url = outcome(partial(RangedReads(s3, bucket).get, key, first, last))
        assert by_url == outcome(partial(by_call, bucket, key, first, last)), (bucket, key, first, last)
        out.append(by_url[0] if isinstance(by_url, tuple) else by_url)
    return out


def test_reads_by_presigned_url_answer_as_ranged_gets_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of a byte range by pre-signed URL reads what a ranged GetObject reads, or fails as it fails, from
    moto's in-process mock and from the embedded cloud (which answers a dataset shard's ranges itself)."""
    expected = answers_in_moto_and_the_embedded_cloud(monkeypatch, ranged_reads)
    assert {a for a in expected if isinstance(a, str)} == {"InvalidRange", "NoSuchKey", "NoSuchBucket"}
    assert [len(a) for a in expected[:4] if isinstance(a, bytes)] == [1, 2000, 10, 6 * 2**20 + 777]


def test_a_long_poll_returns_a_message_when_it_becomes_visible() -> None:
    """A long poll that began before a message became visible returns it, and not before: when its delivery delay
    ends, when its visibility timeout ends, or when its visibility is changed to now."""
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        sqs = cloud.client("sqs")
        queue = sqs.create_queue(QueueName="polls")["QueueUrl"]

        def seconds_until_received(event: Callable[[], None], body: str) -> float:
            """Start a long poll, 0.5 s later cause ``event``: how long after it that poll got the message ``body``."""
            poller = cloud.client("sqs")
            with ThreadPoolExecutor(1) as pool:
                polled = pool.submit(lambda: (poller.receive_message(QueueUrl=queue, WaitTimeSeconds=20), time.time()))
                time.sleep(0.5)
                caused = time.time()
                event()
                received, at = polled.result()
            assert [m["Body"] for m in received.get("Messages", [])] == [body]  # the one poll returned it
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=received["Messages"][0]["ReceiptHandle"])
            return at - caused

        def in_flight() -> str:
            sqs.send_message(QueueUrl=queue, MessageBody="retried")
            return sqs.receive_message(QueueUrl=queue, VisibilityTimeout=30)["Messages"][0]["ReceiptHandle"]

        delayed = seconds_until_received(
            lambda: sqs.send_message(QueueUrl=queue, MessageBody="due", DelaySeconds=1), "due"
        )
        assert delayed >= 1.0, delayed  # not before its delay ended
        receipt = in_flight()
        retried = seconds_until_received(
            lambda: sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=receipt, VisibilityTimeout=1),
            "retried",
        )
        assert retried >= 1.0, retried  # not before its visibility timeout ended
        receipt = in_flight()
        seconds_until_received(
            lambda: sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=receipt, VisibilityTimeout=0),
            "retried",
        )
    finally:
        cloud.stop()


def test_the_server_ends_with_the_process_that_started_it() -> None:
    """However that process ends (here: SIGKILL, which runs no clean-up), its cloud's server does not
    outlive it."""
    script = "from slsml.local.cloud import EmbeddedCloud; c = EmbeddedCloud(); c.start(); print(c.endpoint)"
    owner = subprocess.Popen(
        [sys.executable, "-c", script + "; import time; time.sleep(120)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group
    try:
        endpoint = owner.stdout.readline().strip()
        with pytest.raises(urllib.error.HTTPError) as served:  # it serves: an unsigned request is refused
            urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=5)
        assert served.value.code == 403
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    assert left_running(owner.pid) == []  # the server was the only other process of the group
