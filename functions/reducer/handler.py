"""Reducer: Reduce → averaged update of one shard, optimizer step, new shard in S3 → ReduceDone."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.envelope import pipeline_handler
from slsml.messages import ReduceMessage
from slsml.services import from_env
from slsml.steps import reducer
from slsml.steps.common import failing_run_on_bad_input

metrics = Metrics()


@pipeline_handler(ReduceMessage)
def lambda_handler(messages: list[ReduceMessage], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(messages))
    def reduce(message):
        return reducer.reduce(message, services)
    for message in messages:
        with failing_run_on_bad_input(services, message.run_id, f"reducer {message.shard}"):
            reduce(message)
