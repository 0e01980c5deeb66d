"""WorkLauncher: ModelUpdated (an S3 event via SNS) → one Work message per worker, or run completion;
RunControl (a run started) → keep the run execution's task token."""

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from slsml.envelope import pipeline_handler
from slsml.messages import LauncherEvent, RunStarted, S3Notification, landed_objects
from slsml.services import from_env
from slsml.steps import work_launcher

metrics = Metrics()


@pipeline_handler(LauncherEvent)
def lambda_handler(events: list[RunStarted | S3Notification], context: LambdaContext) -> None:
    services = from_env()
    metrics.add_metric(name="Messages", unit=MetricUnit.Count, value=len(events))
    def launch(landed):
        return work_launcher.on_model(landed, services)
    for event in events:
        if isinstance(event, RunStarted):
            work_launcher.on_run_started(event, services)
            continue
        for landed in landed_objects(event):
            launch(landed)
