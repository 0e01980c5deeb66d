"""The pipeline's request chain as the plan counts it: the requests of one iteration, those of the minimum chain and
the calls beyond it, and what the run's update rule makes a round move.

One iteration, steady state (warm containers, no faults, no duplicates), W workers, R reducers, quorum
q, n = ⌈q·W⌉ participants, M = 4·params bytes, P = M/R bytes per shard, k optimizer state slots:

| function (invocations) | requests per invocation | S3 bytes |
|---|---|---|
| WorkLauncher (1) | GetItem 1, UpdateItem 1, PublishBatch ⌈W/10⌉ | – |
| Worker (W) | GetObject R + 1, PutObject 1 (†), PublishBatch 1 | reads M, writes M + 32 |
| ReduceLauncher (W) | PutItem 1, UpdateItem 1; | – |
| | the firing one also UpdateItem 1, BatchGetItem ⌈W/100⌉, PutItem 1, PublishBatch ⌈R/per batch⌉ | |
| Reducer (R) | GetObject n + 2, PutObject 1 (†), PublishBatch 1 | reads n·P + P(1+k), |
| | | writes P(1+k) |
| Merger (R) | UpdateItem 1; the merging one also ListObjectsV2 1, UpdateItem 2, | – |
| | PutObject 1, PublishBatch 1, DeleteObjects ⌈(R + slots)/1000⌉ (the superseded carried state) | writes the manifest |

(†) An object of the iteration of ``storage.MULTIPART_BYTES`` or more (an update, a shard, a slot's state) is stored
as a multipart upload instead (``creates``): CreateMultipartUpload 1, UploadPart 1 a ``storage.PART_BYTES`` part,
CompleteMultipartUpload 1, each billed as a PUT.

A worker reads the weights entering its iteration from the R shards the reducers stored (one ranged GET each,
concurrently with the iteration's manifest, which names their ETags); the Merger only lists the shards, stores
the manifest and launches the next iteration (ModelMerged to the WorkLauncher). It saves the model
(``models/<i>.keras``) only where the run may end on it (the final one, and each one a watched split is evaluated
on) and at checkpoints: not in a steady iteration.

Each message's proof of origin (``slsml.pipeline.proof``) and its check against the run it names
(``slsml.pipeline.admission``) make no request: the run's public keys and configuration are read once per container and
run.

The minimum chain is what any at-least-once pipeline of this shape must do: the data plane above (S3),
one message per hop, one durable
write per report (W + R), the launch's read and claim, one read of the reports at the fire (⌈W/100⌉
BatchGetItem) and one write per barrier fire (2). The chain's calls beyond
it, each with its reason, are ``chain_extras``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from pydantic import BaseModel, Field

from slsml import rules
from slsml.aws.storage import DELETE_BATCH, upload_parts
from slsml.cost.messages import LONGEST_FLOAT, publish_batches
from slsml.cost.parameters import Parameters
from slsml.cost.workload import Workload, state_slots
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.state import runtable as runstate
from slsml.training import feedback, shards, updates


def creates(objects: int, size: int) -> dict[str, int]:
    """The requests that store ``objects`` objects of an iteration of ``size`` bytes each (``ObjectStore.create``): a
    PutObject each, or, of ``upload_parts`` > 1 parts, a multipart upload each: its CreateMultipartUpload, an
    UploadPart a part and its CompleteMultipartUpload."""
    if not objects:
        return {}
    parts = upload_parts(size)
    if parts == 1:
        return {"s3:PutObject": objects}
    return {
        "s3:CreateMultipartUpload": objects,
        "s3:UploadPart": objects * parts,
        "s3:CompleteMultipartUpload": objects,
    }


def stored(workers: int, reducers: int, traffic: RoundTraffic) -> dict[str, int]:
    """The requests that store an iteration's next trigger (the manifest), its W updates and its R shards."""
    return added({"s3:PutObject": 1}, creates(workers, traffic.update_bytes), creates(reducers, traffic.shard_bytes))


def added(*counts: Mapping[str, int]) -> dict[str, int]:
    """Requests counted by operation, summed."""
    total: dict[str, int] = {}
    for count in counts:
        for operation, number in count.items():
            total[operation] = total.get(operation, 0) + number
    return total


class ExtraCall(BaseModel):
    """Calls of the chain beyond its minimum, and why they are made."""

    operation: str = Field(description="service:Operation")
    count: int = Field(description="per iteration")
    call: str
    reason: str


class NormExchange(BaseModel):
    """What clipping by norm across shards adds to an iteration (``slsml.training.clipping``)."""

    requests: dict[str, int] = Field(default_factory=dict)
    released: int = Field(default=0, description="reducers stepped by a second invocation, released by another")
    release_bytes: int = 0


def norm_exchange(traffic: RoundTraffic, reducers: int, reduce_bytes: int) -> NormExchange:
    """Nothing unless the optimizer clips by norm with R > 1: then each reducer stores its average and its
    sums of squares and counts them; the last one reads them all, claims the release and publishes it to
    the R - 1 others, which read their average back."""
    R, optimizer = reducers, traffic.server
    if R == 1 or not optimizer.clips_by_norm:
        return NormExchange()
    entries = 1 if optimizer.global_clipnorm else R - 1  # the global sum, or each cut variable's
    squares = json.dumps({"squares": {str(10**5 + i): LONGEST_FLOAT for i in range(entries)}})
    release_bytes = reduce_bytes + len(squares)
    return NormExchange(
        requests={
            "dynamodb:PutItem": R,
            "dynamodb:UpdateItem": R + 1,
            "dynamodb:BatchGetItem": math.ceil(R / runstate.BATCH_READ),
            **creates(R, traffic.mean_bytes),
            "s3:GetObject": R - 1,
            "sns:PublishBatch": publish_batches(R - 1, release_bytes),
        },
        released=R - 1,
        release_bytes=release_bytes,
    )


class RoundTraffic(BaseModel):
    """What the run's update rule (``slsml.rules``), compression and staleness make a round move."""

    compute_steps: int = Field(description="gradient computations of a worker's round, each on its local batch")
    update_bytes: int = Field(description="one worker's update object")
    part_bytes: int = Field(description="the largest shard's part of an update, as a reducer reads it")
    table_reads: int = Field(description="ranged GETs of an update's part table before its part (significance, sparse)")
    shard_bytes: int = Field(description="the largest shard object a reducer stores: weights and optimizer state")
    mean_bytes: int = Field(description="the largest shard's average, stored where clipping by norm shares it")
    slot_bytes: int = Field(description="one worker slot's stored state (the rule's; 0: none)")
    residual_bytes: int = Field(description="one worker slot's error-feedback residual (0: none)")
    late_queries: int = Field(description="iterations the reduce fire looks at for late updates (staleness)")
    server: OptimizerConfig = Field(description="what the reducers step with")

    def worker_requests(self, workers: int) -> dict[str, int]:
        """Per steady round: each worker reads the objects its slot stored the round before and stores its own."""
        objects = workers * (bool(self.slot_bytes) + bool(self.residual_bytes))
        stored = added(
            creates(workers * bool(self.slot_bytes), self.slot_bytes),
            creates(workers * bool(self.residual_bytes), self.residual_bytes),
        )
        return {"s3:GetObject": objects, **stored}


def round_traffic(w: Workload, p: Parameters) -> RoundTraffic:
    """The round of the workload's update rule and options."""
    spec, rule, R = w.training, rules.of(w.training), w.reducers
    compression = spec.compression
    trainable, other = w.trainable_params, w.params - w.trainable_params
    tabled = compression.tabled
    density = touched_fraction(w) if compression.kind == "sparse" else p.significance_density

    def part(t: int, o: int) -> int:
        return updates.part_bytes(compression, t, o, math.ceil(density * t))

    # R parts of near-equal trainable and other entries: shard r holds one more of each below its remainder
    (low_t, extra_t), (low_o, extra_o) = divmod(trainable, R), divmod(other, R)
    both = min(extra_t, extra_o)
    total = (
        both * part(low_t + 1, low_o + 1)
        + (extra_t - both) * part(low_t + 1, low_o)
        + (extra_o - both) * part(low_t, low_o + 1)
        + (R - max(extra_t, extra_o)) * part(low_t, low_o)
    )
    server = rule.server_optimizer(spec, w.optimizer)
    shard_weights = math.ceil(w.params / R)  # the largest shard's
    return RoundTraffic(
        compute_steps=rule.compute_steps(spec),
        update_bytes=updates.HEADER_SIZE + (updates.table_bytes(R) if tabled else 0) + total,
        part_bytes=part(math.ceil(trainable / R), math.ceil(other / R)),
        table_reads=int(tabled),
        shard_bytes=shards.HEADER_SIZE + 4 * shard_weights + state_slots(server) * 4 * min(shard_weights, trainable),
        mean_bytes=shards.HEADER_SIZE + 4 * shard_weights,
        slot_bytes=rule.slot_traffic(spec, w.params, w.trainable_params).bytes,
        residual_bytes=feedback.residual_bytes(w.params) if compression.lossy else 0,
        late_queries=spec.staleness_bound,
        server=server,
    )


def touched_fraction(w: Workload) -> float:
    """The fraction of the trainable entries a worker's update holds nonzero, as ``compress sparse`` sends them: every
    entry but an embedding table's, and of those the rows the worker's samples of a round are expected to touch
    (``Embedding.touched``)."""
    samples = math.ceil(w.global_batch / w.workers) * w.training.local_batches
    tables = sum(e.rows * e.width for e in w.embeddings)
    touched = sum(e.touched(samples) * e.width for e in w.embeddings)
    return min(1.0, (w.trainable_params - tables + touched) / w.trainable_params)


def superseded_deletes(spec: TrainingSpec, reducers: int, traffic: RoundTraffic) -> int:
    """DeleteObjects requests of the Merger's delete of the carried state the iteration superseded
    (``slsml.pipeline.steps.common.carried_state``): the R shards and, where the run keeps them, the slot states and
    residuals of every worker the run may have."""
    slots = spec.worker_bounds[1] * (bool(traffic.slot_bytes) + bool(traffic.residual_bytes))
    return math.ceil((reducers + slots) / DELETE_BATCH)


def minimum_chain(
    workers: int,
    reducers: int,
    participants: int,
    work_batches: int,
    reduce_batches: int,
    traffic: RoundTraffic,
    deletes: int,
) -> dict[str, int]:
    """The requests of one steady iteration that any at-least-once pipeline of this shape and update rule makes."""
    W, R, n = workers, reducers, participants
    slots = traffic.worker_requests(W)  # what the worker slots keep between rounds: read once, stored once
    return {
        "dynamodb:GetItem": 1,  # the launch reads the run
        "dynamodb:UpdateItem": 1 + R + 1,  # the launch claim, one durable write per shard report, the merge fire
        "dynamodb:PutItem": W + 1,  # one durable write per worker report, the reduce fire (its participants)
        "dynamodb:BatchGetItem": math.ceil(W / runstate.BATCH_READ),  # the reports, read once at the fire
        # each worker's trigger (the manifest, which names the shards by ETag) and weights, a part of each shard; each
        # reducer's parts, its shard and the manifest that names it
        "s3:GetObject": W * (1 + R) + R * n + 2 * R + slots["s3:GetObject"],
        # the merge's look that every shard is stored (the count is a hint: a duplicate counts twice)
        "s3:ListObjectsV2": 1,
        # the next iteration's trigger, the updates, the shards, the slots' state
        **added(
            stored(W, R, traffic),
            {operation: count for operation, count in slots.items() if operation != "s3:GetObject"},
        ),
        # the carried state a stopped run would resume from is kept untagged (no lifecycle rule expires it), so the
        # state each iteration supersedes is deleted (DELETE requests are free)
        "s3:DeleteObjects": deletes,
        "sns:PublishBatch": work_batches + W + reduce_batches + R + 1,  # one message per hop
    }


def option_extras(reducers: int, participants: int, traffic: RoundTraffic, counted: int = 0) -> list[ExtraCall]:
    """The calls beyond the minimum chain that the run's options add, each with why it is made. ``counted``: the
    invocations of an iteration that add their cost to the run's spend (a run with a budget; else 0)."""
    extras = []
    if counted:
        extras += [
            ExtraCall(
                operation="dynamodb:UpdateItem",
                count=counted,
                call="each invocation's addition of its cost to the run's spend",
                reason="a budget stops the run on its spend as it goes, which each"
                " function counts as it runs (not read from its logs after the fact)",
            ),
            ExtraCall(
                operation="dynamodb:GetItem",
                count=1,
                call="the launch's read of the run's spend",
                reason="the launch of each iteration stops the run whose spend reached its budget",
            ),
        ]
    if traffic.table_reads:
        extras.append(
            ExtraCall(
                operation="s3:GetObject",
                count=reducers * participants * traffic.table_reads,
                call="each reducer's read of its two entries of every update's part table",
                reason="significance parts vary in size, so a reducer learns where its part lies before reading it",
            )
        )
    if traffic.late_queries:
        extras.append(
            ExtraCall(
                operation="dynamodb:Query",
                count=traffic.late_queries,
                call="the reduce fire's look for late updates",
                reason=f"bounded staleness folds the late updates of the last {traffic.late_queries} iterations",
            )
        )
    return extras


def chain_extras(
    workers: int, reducers: int, participants: int, traffic: RoundTraffic, counted: int = 0
) -> list[ExtraCall]:
    """The chain's calls beyond the minimum one, each with why it is made (``counted``: ``option_extras``')."""
    return [
        *option_extras(reducers, participants, traffic, counted),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=workers,
            call="the counter update per worker report",
            reason="the O(1) signal that the barrier may be complete, without reading every record on every report",
        ),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=1,
            call="the reduce fire's mark on the counter",
            reason="the participants item is the fire; its list grows with W, so it cannot live on the "
            "counter that every report rewrites, where the mark turns late reports away",
        ),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=1,
            call="the run advance, apart from the merge fire",
            reason="the run item (status, iteration, token) and the iteration counter are different items; "
            "the advance is also the heartbeat and the stop check",
        ),
    ]
