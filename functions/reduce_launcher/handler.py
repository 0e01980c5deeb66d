"""ReduceLauncher: WorkDone → (at the quorum, once) one Reduce message per reducer."""

from slsml.envelope import pipeline_handler
from slsml.messages import WorkDone
from slsml.steps import reduce_launcher

lambda_handler = pipeline_handler("reduce_launcher", WorkDone, reduce_launcher.on_work_done,
                                  stage=lambda _: "reduce launcher", idempotent=False)
