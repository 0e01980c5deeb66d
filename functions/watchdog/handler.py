"""Watchdog: Deadlines queue → fire a late barrier, re-launch what is missing, or fail the run."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.deployment import Metric
from slsml.envelope import SqsMessages, pipeline_handler
from slsml.idempotency import once_per_message
from slsml.messages import Deadline
from slsml.services import from_env
from slsml.steps import watchdog
from slsml.steps.common import failing_run_on_bad_input

metrics = Metrics()
QUIET = {None, watchdog.Action.NOTHING, watchdog.Action.NOT_DUE, watchdog.Action.WATCHING_REDUCE}


@pipeline_handler(Deadline, envelope=SqsMessages)
def lambda_handler(messages: list[Deadline], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(messages))
    watch = once_per_message(lambda deadline: watchdog.on_deadline(deadline, services), context)
    for message in messages:
        with failing_run_on_bad_input(services, message.run_id, f"watchdog ({message.stage} stage)"):
            if watch(message) not in QUIET:
                metrics.add_metric(name=Metric.DEADLINE_ACTIONS, unit=MetricUnit.Count, value=1)
