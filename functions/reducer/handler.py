"""Reducer: Reduce → averaged update of one shard, optimizer step, new shard in S3 → ReduceDone."""

from slsml.envelope import pipeline_handler
from slsml.messages import ReduceMessage
from slsml.steps import reducer

lambda_handler = pipeline_handler("reducer", ReduceMessage, reducer.reduce, stage=lambda m: f"reducer {m.shard}",
                                  idempotent=False)
