"""Embedded clouds are isolated: two alive in one process hold their own resources."""

from __future__ import annotations

import boto3
import pytest

from slsml import aws, wiring
from slsml.local.cloud import EmbeddedCloud, LocalDeployment


def test_two_clouds_in_one_process_do_not_share_state(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = EmbeddedCloud(), EmbeddedCloud()
    first.start()
    second.start()
    try:
        one = first.provision()
        two = second.provision()  # the same names: would collide if the clouds shared state
        _use(monkeypatch, one)
        aws.client("s3").put_object(Bucket=one.bucket, Key="runs/x/run.json", Body=b"{}")
        _use(monkeypatch, two)  # the cached clients must now reach the second cloud
        assert aws.client("s3").list_objects_v2(Bucket=two.bucket).get("KeyCount", 0) == 0
        sns = boto3.client("sns", endpoint_url=second.endpoint, region_name="us-east-1")
        topics = {t["TopicArn"].rsplit("-", 1)[-1] for t in sns.list_topics()["Topics"]}
        assert topics == {t.name for t in wiring.TOPICS}
        sqs = boto3.client("sqs", endpoint_url=second.endpoint, region_name="us-east-1")
        queued = [fn for fn in wiring.FUNCTIONS if not fn.reads_dead_letters]  # the reader takes the DLQs'
        assert len(sqs.list_queues()["QueueUrls"]) == 2 * len(queued)  # one queue + DLQ each
    finally:
        first.stop()
        second.stop()


def _use(monkeypatch: pytest.MonkeyPatch, deployment: LocalDeployment) -> None:
    """What ``use_deployment`` does, undone after the test."""
    for name, value in deployment.environment().items():
        monkeypatch.setenv(name, value)
