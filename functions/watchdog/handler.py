"""Watchdog: Deadlines queue → fire a late barrier, re-launch what is missing, or fail the run."""

from slsml.envelope import SqsMessages, pipeline_handler
from slsml.messages import Deadline
from slsml.steps import watchdog

lambda_handler = pipeline_handler(
    "watchdog", Deadline, watchdog.on_deadline, envelope=SqsMessages, stage=lambda m: f"watchdog ({m.stage} stage)"
)
