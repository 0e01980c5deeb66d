"""WorkLauncher: ModelUpdated (an S3 event via SNS) → one Work message per worker, or run completion;
RunControl (a run started) → keep the run execution's task token."""

from typing import Any

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.services import Services
from slsml.pipeline.steps import work_launcher
from slsml.spec.messages import LauncherEvent, ModelLanded, RunStarted, S3Notification, landed_objects


def launch(event: RunStarted | ModelLanded, services: Services) -> Any:
    if isinstance(event, RunStarted):
        return work_launcher.on_run_started(event, services)
    return work_launcher.on_model(event, services)


def landed(event: RunStarted | S3Notification) -> list[RunStarted | ModelLanded]:
    return [event] if isinstance(event, RunStarted) else landed_objects(event)


lambda_handler = pipeline_handler("work_launcher", LauncherEvent, launch, unpack=landed, idempotent=False)
