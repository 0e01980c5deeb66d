"""Merger: ReduceDone → (when all shards are in, once) the next model in S3, which triggers WorkLauncher."""

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.steps import merger
from slsml.spec.messages import ReduceDone

lambda_handler = pipeline_handler(
    "merger", ReduceDone, merger.on_reduce_done, stage=lambda _: "merger", idempotent=False
)
