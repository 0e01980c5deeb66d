"""Publishing pipeline messages to their SNS topics."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slsml.spec.messages import BATCH_BYTES, BATCH_ENTRIES, PARALLEL_BATCHES, Message
from slsml.spec.wiring import Topic


class Bus:
    def __init__(self, sns: Any, topic_arns: dict[str, str], sign: Callable[[Message], Message]) -> None:
        self.sns = sns
        self.topic_arns = topic_arns
        self.sign = sign  # the proof of origin each message carries (slsml.pipeline.proof)

    def publish(self, topic: Topic, messages: Sequence[Message]) -> None:
        """Publish ``messages``, signed, in batches, ``PARALLEL_BATCHES`` at a time (SNS keeps no order between
        them)."""
        arn = self.topic_arns[topic.name]

        def send(batch: list[str]) -> None:
            entries = [{"Id": str(i), "Message": body} for i, body in enumerate(batch)]
            response = self.sns.publish_batch(TopicArn=arn, PublishBatchRequestEntries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"publishing to {topic.name} failed: {response['Failed']}")

        grouped = list(batches([self.sign(message).model_dump_json() for message in messages]))
        if len(grouped) <= 1:
            for batch in grouped:
                send(batch)
            return
        with ThreadPoolExecutor(max_workers=min(PARALLEL_BATCHES, len(grouped))) as pool:
            list(pool.map(send, grouped))


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
