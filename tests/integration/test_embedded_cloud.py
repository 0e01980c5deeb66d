"""The embedded cloud provisions the wiring spec and can be started again in the same process."""

from __future__ import annotations

import boto3

from slsml import aws, wiring
from slsml.local.cloud import EmbeddedCloud, use_deployment


def test_a_second_cloud_in_one_process_starts_empty_and_is_the_one_reached() -> None:
    first = EmbeddedCloud()
    first.start()
    try:
        deployment = first.provision()
        use_deployment(deployment)
        aws.client("s3").put_object(Bucket=deployment.bucket, Key="runs/x/run.json", Body=b"{}")
    finally:
        first.stop()

    second = EmbeddedCloud()
    second.start()
    try:
        deployment = second.provision()  # the same names: would fail if the first cloud's state survived
        use_deployment(deployment)
        listed = aws.client("s3").list_objects_v2(Bucket=deployment.bucket).get("KeyCount", 0)
        assert listed == 0
        sns = boto3.client("sns", endpoint_url=second.endpoint, region_name="us-east-1")
        topics = {t["TopicArn"].rsplit("-", 1)[-1] for t in sns.list_topics()["Topics"]}
        assert topics == {t.name for t in wiring.TOPICS}
        sqs = boto3.client("sqs", endpoint_url=second.endpoint, region_name="us-east-1")
        assert len(sqs.list_queues()["QueueUrls"]) == 2 * len(wiring.FUNCTIONS)  # one queue + DLQ each
    finally:
        second.stop()
