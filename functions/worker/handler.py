"""Worker: Work → its slice's update in S3 (one part per reducer) → WorkDone."""

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.steps import worker
from slsml.spec.messages import WorkMessage

lambda_handler = pipeline_handler(
    "worker", WorkMessage, worker.work, stage=lambda m: f"worker {m.worker}", idempotent=False
)
