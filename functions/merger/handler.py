"""Merger: ReduceDone → (when all shards are in, once) the next model in S3, which triggers WorkLauncher."""

from slsml.envelope import pipeline_handler
from slsml.messages import ReduceDone
from slsml.steps import merger

lambda_handler = pipeline_handler("merger", ReduceDone, merger.on_reduce_done, stage=lambda _: "merger",
                                  idempotent=False)
