"""Publishing pipeline messages to their SNS topics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slsml.messages import Message
from slsml.wiring import Topic

_BATCH = 10  # SNS PublishBatch limit


class Bus:
    def __init__(self, sns: Any, topic_arns: dict[str, str]) -> None:
        self.sns = sns
        self.topic_arns = topic_arns

    def publish(self, topic: Topic, messages: Sequence[Message]) -> None:
        arn = self.topic_arns[topic.name]
        for start in range(0, len(messages), _BATCH):
            batch = messages[start : start + _BATCH]
            response = self.sns.publish_batch(
                TopicArn=arn,
                PublishBatchRequestEntries=[
                    {"Id": str(i), "Message": message.model_dump_json()} for i, message in enumerate(batch)
                ],
            )
            if response.get("Failed"):
                raise RuntimeError(f"publishing to {topic.name} failed: {response['Failed']}")
