"""Worker: Work → its slice's update in S3 (one part per reducer) → WorkDone; under ``stale_weights``, the same
invocation goes on to the worker's next round where it can (``worker.going_on``)."""

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.steps import worker
from slsml.spec.messages import WorkMessage

# a continuation is handled once (its duplicates are dropped); a round's first message is idempotent by itself
lambda_handler = pipeline_handler(
    "worker",
    WorkMessage,
    worker.step,
    stage=lambda m: f"worker {m.worker}",
    idempotent=lambda m: m.resume > 0,
    goes_on=worker.going_on,
)
