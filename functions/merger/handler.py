"""Merger: ReduceDone → (when all shards are in, once) the next model in S3, which triggers WorkLauncher."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.envelope import pipeline_handler
from slsml.messages import ReduceDone
from slsml.services import from_env
from slsml.steps import merger
from slsml.steps.common import failing_run_on_bad_input

metrics = Metrics()


@pipeline_handler(ReduceDone)
def lambda_handler(messages: list[ReduceDone], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(messages))
    def merge(message):
        return merger.on_reduce_done(message, services)
    for message in messages:
        with failing_run_on_bad_input(services, message.run_id, "merger"):
            merge(message)
