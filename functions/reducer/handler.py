"""Reducer: Reduce → averaged update of one shard, optimizer step, new shard in S3 → ReduceDone."""

from slsml.pipeline.envelope import pipeline_handler
from slsml.pipeline.steps import reducer
from slsml.spec.messages import ReduceMessage

lambda_handler = pipeline_handler(
    "reducer", ReduceMessage, reducer.reduce, stage=lambda m: f"reducer {m.shard}", idempotent=False
)
