"""RunStarter: ModelDropped (an S3 event for incoming/<name>.keras via SNS) → a run with the defaults."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.envelope import pipeline_handler
from slsml.idempotency import once_per_message
from slsml.messages import S3Notification, landed_objects
from slsml.services import from_env
from slsml.steps import run_starter

metrics = Metrics()


@pipeline_handler(S3Notification)
def lambda_handler(notifications: list[S3Notification], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(notifications))
    defaults = run_starter.deployment_defaults()
    start = once_per_message(lambda landed: run_starter.on_dropped(landed, services, defaults), context)
    for notification in notifications:
        for landed in landed_objects(notification):
            start(landed)
