"""Watchdog: Deadlines queue → fire a late barrier, re-launch what is missing, or fail the run."""

from slsml.pipeline.envelope import SqsMessages, pipeline_handler
from slsml.pipeline.steps import watchdog
from slsml.spec.messages import Deadline

lambda_handler = pipeline_handler(
    "watchdog", Deadline, watchdog.on_deadline, envelope=SqsMessages, stage=lambda m: f"watchdog ({m.stage} stage)"
)
