"""The pipeline's messages as the plan sizes them (Work, Reduce, WorkDone, the manifest), each serialized as the
pipeline serializes it at its largest, and the PublishBatch calls that carry them."""

from __future__ import annotations

import math
from functools import lru_cache

from slsml.accounting import capacity
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.messages import (
    BATCH_BYTES,
    BATCH_ENTRIES,
    MAX_MESSAGE_BYTES,
    Manifest,
    Participant,
    ReduceMessage,
    WorkDone,
    WorkMessage,
)
from slsml.state.barrier import quorum_count
from slsml.state.records import dynamo

LONGEST_FLOAT = -1.2345678901234567e-300  # the most bytes a float64 takes in JSON and in DynamoDB
LONGEST_ETAG = '"' + "0" * 32 + '-10000"'  # an update's ETag at its longest: a multipart upload of S3's most parts


@lru_cache(maxsize=256)
def message_bytes(participants: int, samples: int, reducers: int) -> tuple[int, int]:
    """(Work, Reduce) message sizes as the pipeline serializes them, for a run id of the longest form."""
    run_id = "r" * 63
    work = WorkMessage(run_id=run_id, iteration=999_999, worker=participants - 1, workers=participants)
    reduce = ReduceMessage(
        run_id=run_id,
        iteration=999_999,
        shard=reducers - 1,
        participants=tuple(Participant(worker=w, samples=samples, etag=LONGEST_ETAG) for w in range(participants)),
    )
    return len(work.model_dump_json().encode()), len(reduce.model_dump_json().encode())


@lru_cache(maxsize=256)
def done_bytes(workers: int, samples: int, metric_values: int) -> int:
    """A WorkDone message as the pipeline serializes it, its metrics state of ``metric_values`` values and every
    figure at the longest a float takes, for a run id of the longest form."""
    done = WorkDone(
        run_id="r" * 63,
        iteration=999_999,
        worker=workers - 1,
        samples=samples,
        loss=LONGEST_FLOAT,
        metrics=[LONGEST_FLOAT] * metric_values,
        compute_s=-LONGEST_FLOAT,
        etag=LONGEST_ETAG,
    )
    return len(done.model_dump_json().encode())


@lru_cache(maxsize=256)  # every predicted variant of a run adds the same state: counted once
def state_item_bytes(metric_values: int) -> int:
    """What a metrics state of ``metric_values`` values adds to a DynamoDB item (a worker's record's ``metrics``,
    the counter's ``train_state`` once the reduce fired), every value at the longest a float takes."""
    return capacity.item_bytes(dynamo({"train_state": [LONGEST_FLOAT] * metric_values}))


def largest_reduce(spec: TrainingSpec, workers: int | None = None) -> tuple[int, int]:
    """The most participants a Reduce message of a run of ``spec`` (its iterations resolved; ``workers``: as
    ``TrainingSpec.asked_workers``) can list, and that message's bytes: every worker, at its last attempt, and
    with bounded staleness the late updates of the ``staleness`` iterations before, each of which may have fired
    with the deadline floor's fewest workers; each participant at the largest figures it may carry, for a run id
    of the longest form."""
    workers = spec.asked_workers(workers)
    late = spec.staleness_bound * (workers - quorum_count(workers, min(spec.deadline_floor, spec.quorum)))
    samples, attempt = spec.global_batch * spec.local_batches, spec.deadline_retries
    return _largest_reduce(workers, late, samples, attempt, (spec.iterations or 1_000_000) - 1, spec.reducers - 1)


@lru_cache(maxsize=256)  # a plan's recommendation predicts thousands of variants of one run: one message each
def _largest_reduce(workers: int, late: int, samples: int, attempt: int, iteration: int, shard: int) -> tuple[int, int]:
    participants = [Participant(worker=w, attempt=attempt, samples=samples, etag=LONGEST_ETAG) for w in range(workers)]
    participants += [
        Participant(worker=w % workers, attempt=attempt, samples=samples, iteration=iteration, etag=LONGEST_ETAG)
        for w in range(late)
    ]
    reduce = ReduceMessage(
        run_id="r" * 63, iteration=iteration, shard=shard, attempt=attempt, participants=tuple(participants)
    )
    return len(participants), len(reduce.model_dump_json().encode())


def listed(spec: TrainingSpec, participants: int, workers: int | None = None) -> str:
    """Who the ``participants`` of a run's largest Reduce message (``largest_reduce``) are, in words."""
    workers = spec.asked_workers(workers)
    late = (
        (
            f", and with staleness {spec.staleness_bound} and deadline_floor {spec.deadline_floor:g} up to"
            f" {participants - workers:,} late updates folded in"
        )
        if spec.staleness_bound
        else ""
    )
    return f"{participants:,} participants ({workers} workers{late})"


def check_messages(spec: TrainingSpec, workers: int | None = None) -> None:
    """BadInputError, naming the options that make it so, if a run of ``spec`` (``workers``: as
    ``TrainingSpec.asked_workers``) could send a message over the size slsml's functions take
    (``MAX_MESSAGE_BYTES``)."""
    participants, size = largest_reduce(spec, workers)
    if size > MAX_MESSAGE_BYTES:
        raise BadInputError(
            f"a Reduce message of this run may list {listed(spec, participants, workers)}:"
            f" {size:,} B, over the {MAX_MESSAGE_BYTES:,} B slsml's messages may hold; lower the workers"
            + (" or staleness, or raise deadline_floor" if spec.staleness_bound else "")
        )


def publish_batches(messages: int, message_size: int) -> int:
    """PublishBatch calls for ``messages`` of one size (``slsml.pipeline.bus``: 10 entries, 256 KiB a batch)."""
    per_batch = max(1, min(BATCH_ENTRIES, BATCH_BYTES // message_size))
    return math.ceil(messages / per_batch)


def manifest_bytes(reducers: int) -> int:
    """An iteration's manifest (``slsml.spec.messages.Manifest``) of R shards' ETags, at the largest iteration."""
    etag = '"' + "0" * 32 + '"'
    return len(Manifest(iteration=999_999, shards=[etag] * reducers).model_dump_json())
