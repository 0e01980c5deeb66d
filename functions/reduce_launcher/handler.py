"""ReduceLauncher: WorkDone → (at the quorum, once) one Reduce message per reducer."""

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.steps import reduce_launcher
from slsml.spec.messages import WorkDone

lambda_handler = pipeline_handler(
    "reduce_launcher", WorkDone, reduce_launcher.on_work_done, stage=lambda _: "reduce launcher", idempotent=False
)
