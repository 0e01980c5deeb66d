"""ReduceLauncher: WorkDone → (at the quorum, once) one Reduce message per reducer."""

from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from slsml.deployment import Metric
from slsml.envelope import pipeline_handler
from slsml.messages import WorkDone
from slsml.services import Services
from slsml.steps import reduce_launcher

metrics = Metrics()


def record(done: WorkDone, services: Services) -> Any:
    metrics.add_metric(Metric.WORKERS_DONE, MetricUnit.Count, 1)
    return reduce_launcher.on_work_done(done, services)


lambda_handler = pipeline_handler("reduce_launcher", WorkDone, record, stage=lambda _: "reduce launcher",
                                  idempotent=False)
