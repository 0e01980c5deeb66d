"""WorkLauncher: ModelUpdated (the initial model's S3 event via SNS, or the Merger's ModelMerged) → one Work message
per worker, or run completion; RunControl (a run started) → keep the run execution's task token."""

from typing import Any

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.services import Services
from slsml.pipeline.steps import work_launcher
from slsml.spec.messages import LauncherEvent, ModelLanded, ModelMerged, RunStarted, S3Notification, landed_objects


def launch(event: RunStarted | ModelMerged | ModelLanded, services: Services) -> Any:
    if isinstance(event, RunStarted):
        return work_launcher.on_run_started(event, services)
    if isinstance(event, ModelMerged):
        return work_launcher.on_merged(event, services)
    return work_launcher.on_model(event, services)


def landed(event: RunStarted | ModelMerged | S3Notification) -> list[RunStarted | ModelMerged | ModelLanded]:
    return landed_objects(event) if isinstance(event, S3Notification) else [event]


lambda_handler = pipeline_handler("work_launcher", LauncherEvent, launch, unpack=landed, idempotent=False)
