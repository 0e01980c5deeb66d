"""Publishing: batches within SNS's PublishBatch limits."""

from __future__ import annotations

from slsml.pipeline.bus import batches
from slsml.spec.messages import BATCH_BYTES, BATCH_ENTRIES


def test_publish_batches_keep_within_the_sns_limits_on_entries_and_bytes() -> None:
    bodies = ["x" * 50_000] * 12 + ["y"] * 25  # Reduce messages of a 1000-worker run are about 45 KiB
    grouped = list(batches(bodies))
    assert [body for batch in grouped for body in batch] == bodies
    assert all(len(b) <= BATCH_ENTRIES and sum(len(x) for x in b) <= BATCH_BYTES for b in grouped)
    assert len(grouped[0]) == 5  # the size limit, not the entry limit, cut the first batch


def test_publish_delivers_every_message_of_many_batches_sent_at_once() -> None:
    """37 batches, 16 in flight at a time: each message is delivered once (SNS → SQS in moto)."""
    import boto3
    from moto import mock_aws

    from slsml.pipeline.bus import Bus
    from slsml.spec import wiring
    from slsml.spec.messages import PARALLEL_BATCHES, WorkMessage

    with mock_aws():
        sns, sqs = boto3.client("sns", region_name="us-east-1"), boto3.client("sqs", region_name="us-east-1")
        topic = sns.create_topic(Name=wiring.WORK.name)["TopicArn"]
        queue = sqs.create_queue(QueueName="work")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
        messages = [WorkMessage(run_id="r", iteration=0, worker=w, workers=370) for w in range(370)]
        assert len(list(batches([m.model_dump_json() for m in messages]))) > 2 * PARALLEL_BATCHES
        Bus(sns, {wiring.WORK.name: topic}, lambda message: message).publish(wiring.WORK, messages)
        received: list[int] = []
        while batch := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
            received += [WorkMessage.model_validate_json(m["Body"]).worker for m in batch]
            sqs.delete_message_batch(
                QueueUrl=queue,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)],
            )
        assert sorted(received) == list(range(370))
