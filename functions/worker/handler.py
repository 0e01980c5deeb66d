"""Worker: Work → its slice's update in S3 (one part per reducer) → WorkDone."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.deployment import Metric
from slsml.envelope import pipeline_handler
from slsml.messages import WorkMessage
from slsml.services import from_env
from slsml.steps import worker
from slsml.steps.common import failing_run_on_bad_input

metrics = Metrics()


@pipeline_handler(WorkMessage)
def lambda_handler(messages: list[WorkMessage], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(messages))
    def work(message):
        return worker.work(message, services)
    for message in messages:
        with failing_run_on_bad_input(services, message.run_id, f"worker {message.worker}"):
            done = work(message)
            if done:
                metrics.add_metric("WorkerComputeSeconds", MetricUnit.Seconds, done.compute_s)
                if done.finite:  # a non-finite update is announced with no samples and no loss
                    metrics.add_metric(Metric.TRAIN_LOSS, MetricUnit.NoUnit, done.loss)
