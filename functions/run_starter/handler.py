"""RunStarter: ModelDropped (an S3 event for incoming/<name>.keras via SNS) → a run with the defaults."""

from slsml.accounting import usage
from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.services import Services
from slsml.pipeline.steps import run_starter
from slsml.spec.messages import ModelLanded, S3Notification, landed_objects


def start(landed: ModelLanded, services: Services) -> str | None:
    run_id = run_starter.on_dropped(landed, services, run_starter.deployment_defaults())
    usage.attribute(run_id)
    return run_id


lambda_handler = pipeline_handler("run_starter", S3Notification, start, unpack=landed_objects)
