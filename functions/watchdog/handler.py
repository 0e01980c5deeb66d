"""Watchdog: Deadlines queue → fire a late barrier, re-launch what is missing, or fail the run."""

from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from slsml.deployment import Metric
from slsml.envelope import SqsMessages, pipeline_handler
from slsml.messages import Deadline
from slsml.services import Services
from slsml.steps import watchdog

metrics = Metrics()
QUIET = {None, watchdog.Action.NOTHING, watchdog.Action.NOT_DUE, watchdog.Action.WATCHING_REDUCE}


def watch(deadline: Deadline, services: Services) -> Any:
    action = watchdog.on_deadline(deadline, services)
    if action not in QUIET:
        metrics.add_metric(name=Metric.DEADLINE_ACTIONS, unit=MetricUnit.Count, value=1)
    return action


lambda_handler = pipeline_handler(
    "watchdog", Deadline, watch, envelope=SqsMessages, stage=lambda m: f"watchdog ({m.stage} stage)"
)
