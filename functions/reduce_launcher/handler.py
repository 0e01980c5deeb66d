"""ReduceLauncher: WorkDone → (at the quorum, once) one Reduce message per reducer."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.deployment import Metric
from slsml.envelope import pipeline_handler
from slsml.messages import WorkDone
from slsml.services import from_env
from slsml.steps import reduce_launcher
from slsml.steps.common import failing_run_on_bad_input

metrics = Metrics()


@pipeline_handler(WorkDone)
def lambda_handler(messages: list[WorkDone], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(messages))
    def record(done):
        return reduce_launcher.on_work_done(done, services)
    for message in messages:
        with failing_run_on_bad_input(services, message.run_id, "reduce launcher"):
            metrics.add_metric(Metric.WORKERS_DONE, MetricUnit.Count, 1)
            record(message)
