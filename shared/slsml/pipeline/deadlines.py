"""Sending deadlines: SQS messages that become visible when they are due (SQS delays at most 15
minutes; a later deadline is delivered early and sent on again by the watchdog)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from slsml.spec.messages import Deadline

MAX_DELAY_S = 900  # SQS DelaySeconds limit


class DeadlineQueue:
    def __init__(self, sqs: Any, queue_url: str | None, sign: Callable[[Deadline], Deadline]) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.sign = sign  # the proof of origin each deadline carries (slsml.pipeline.proof)

    def schedule(self, deadline: Deadline) -> None:
        if not self.queue_url:
            raise RuntimeError("no deadline queue configured: is this function deployed by slsml?")
        delay = min(MAX_DELAY_S, max(0, math.ceil(deadline.due_at - time.time())))  # never before it is due
        body = self.sign(deadline).model_dump_json()
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body, DelaySeconds=delay)
