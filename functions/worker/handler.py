"""Worker: Work → its slice's update in S3 (one part per reducer) → WorkDone."""

from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from slsml.deployment import Metric
from slsml.envelope import pipeline_handler
from slsml.messages import WorkMessage
from slsml.services import Services
from slsml.steps import worker

metrics = Metrics()


def work(message: WorkMessage, services: Services) -> Any:
    done = worker.work(message, services)
    if done:
        metrics.add_metric("WorkerComputeSeconds", MetricUnit.Seconds, done.compute_s)
        if done.finite:  # a non-finite update is announced with no samples and no loss
            metrics.add_metric(Metric.TRAIN_LOSS, MetricUnit.NoUnit, done.loss)
    return done


lambda_handler = pipeline_handler("worker", WorkMessage, work, stage=lambda m: f"worker {m.worker}", idempotent=False)
