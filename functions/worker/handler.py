"""Worker: Work → its slice's update in S3 (one part per reducer) → WorkDone."""

from slsml.envelope import pipeline_handler
from slsml.messages import WorkMessage
from slsml.steps import worker

lambda_handler = pipeline_handler("worker", WorkMessage, worker.work, stage=lambda m: f"worker {m.worker}",
                                  idempotent=False)
