"""Publishing pipeline messages to their SNS topics."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from slsml.spec.messages import Message
from slsml.spec.wiring import Topic

BATCH_ENTRIES = 10  # SNS PublishBatch limits: 10 entries…
BATCH_BYTES = 256 * 1024  # …and 256 KiB in all


class Bus:
    def __init__(self, sns: Any, topic_arns: dict[str, str]) -> None:
        self.sns = sns
        self.topic_arns = topic_arns

    def publish(self, topic: Topic, messages: Sequence[Message]) -> None:
        arn = self.topic_arns[topic.name]
        for batch in batches([message.model_dump_json() for message in messages]):
            entries = [{"Id": str(i), "Message": body} for i, body in enumerate(batch)]
            response = self.sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"publishing to {topic.name} failed: {response['Failed']}")


def batches(bodies: list[str]) -> Iterator[list[str]]:
    """``bodies`` in order, in batches within PublishBatch's limits on entries and total size."""
    batch: list[str] = []
    size = 0
    for body in bodies:
        length = len(body.encode())
        if batch and (len(batch) == BATCH_ENTRIES or size + length > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(body)
        size += length
    if batch:
        yield batch
