"""A worker's round as the plan sees it: its share of the batch in micro-batches that fit its memory, a GPU
worker's its accelerator memory (``slsml.rounds.sizing``, as the worker sizes them); the S3 rate it moves its bytes
at, and how long it takes to store an object (a large one in parts, sent at once); and a round that outlasts the
Worker's timeout handed on to fresh invocations (``slsml.training.progress``)."""

from __future__ import annotations

import math
from typing import NamedTuple

from pydantic import BaseModel, Field

from slsml import rules
from slsml.aws.cache import MEMORY_SHARE
from slsml.aws.storage import PARALLEL_PARTS, upload_parts
from slsml.cost import gpuworker
from slsml.cost.chain import ExtraCall, RoundTraffic, creates
from slsml.cost.parameters import Parameters
from slsml.cost.timing import transfer
from slsml.cost.workload import Workload
from slsml.rounds import accumulate, sizing
from slsml.spec.algorithms import ALGORITHMS
from slsml.training import progress


class MicroBatches(NamedTuple):
    """How a worker of some memory computes its share of each global batch (``slsml.rounds``)."""

    size: int  # the most samples it computes at once
    per_step: int  # micro-batches of a step
    fitting: int  # the most samples that fit a step (0: not one)
    needed_mb: float  # the memory its step takes


def micro_batching(w: Workload, p: Parameters, traffic: RoundTraffic, memory_mb: int) -> MicroBatches:
    """The micro-batches of a worker of ``memory_mb`` as it sizes them (``slsml.rounds.sizing``): the run's
    ``micro_batch``, else the most samples that fit beside its warm cache (``cache_mb``, else ``MEMORY_SHARE`` of its
    memory), or, a GPU worker, the most whose step fits its accelerator memory (its layer outputs on the GPU, not in
    the function's memory), one where not even one does; and the memory its largest micro-batch's step takes of the
    function's."""
    memory = sizing.WorkerMemory(
        memory_mb,
        MEMORY_SHARE * memory_mb if w.cache_mb is None else w.cache_mb,
        4 * w.params,
        w.activation_bytes_per_sample,
        sizing.other_bytes(4 * w.params, traffic.slot_bytes, traffic.residual_bytes, w.training.stale_weights),
    )
    share, fitting = math.ceil(w.global_batch / w.workers), memory.micro_batch()
    a = w.accelerator
    if a is not None:
        device = sizing.AcceleratorMemory(a.gib, 4 * w.params, w.activation_bytes_per_sample, a.precision)
        fitting = device.micro_batch()
    size = min(share, w.training.micro_batch or max(1, fitting))
    count = memory.micro_batches(share, size)
    on_host = size if a is None else 0  # a GPU worker's layer outputs are the GPU's
    # the runtime and model buffers of the parameters beyond the worker's own estimate (overridden: calibrated)
    calibrated = (
        p.tf_runtime_mb
        - sizing.TF_RUNTIME_MB
        + (p.worker_model_copies - sizing.MODEL_COPIES) * 4 * w.params / sizing.MB
    )
    largest = accumulate.sizes(share, size)[0] if on_host else 0
    return MicroBatches(size, count, fitting, memory.needed_mb(largest, count) + calibrated)


def s3_mb_s(w: Workload, p: Parameters, connections: float) -> tuple[float, float]:
    """(read, write) S3 MB/s of a worker moving bytes over ``connections`` at once: a Lambda function's
    (``s3_read_mb_s``, ``s3_write_mb_s``, measured whatever the connections), a GPU worker's its instance's
    (``gpuworker.s3_mb_s``)."""
    if w.accelerator is None:
        return p.s3_read_mb_s, p.s3_write_mb_s
    rate = gpuworker.s3_mb_s(w, connections)
    return rate, rate


def write_s(w: Workload, p: Parameters, size: int) -> float:
    """Seconds a worker takes to store an object of its iteration of ``size`` bytes (``ObjectStore.create``): one
    PutObject, or a multipart upload's start, its ``upload_parts`` parts ``PARALLEL_PARTS`` at a time (a GPU worker's
    rate: over as many connections; a Lambda function's: its own, whatever the connections) and its completion."""
    parts = upload_parts(size)
    at_once = min(parts, PARALLEL_PARTS)
    framing = 0.0 if parts == 1 else 2 * p.s3_request_s  # CreateMultipartUpload, CompleteMultipartUpload
    return framing + transfer(parts, size, p.s3_request_s, s3_mb_s(w, p, at_once)[1], at_once)


class Continuations(BaseModel):
    """A worker's round that would outlast the Worker's timeout goes on in fresh invocations of the same attempt,
    handed on between micro-batches (``slsml.training.progress``): how many, and what they add to an iteration."""

    timeout_s: float = Field(description="the Worker's timeout (at most Lambda's)")
    invocations: int = Field(description="Worker invocations one round takes (1: it fits one)")
    micro_batches_per_invocation: int = Field(
        description="micro-batches an invocation computes before it hands the round on (a step is the plan's"
        " micro_batches of them)"
    )
    progress_bytes: int = Field(description="one round's progress, stored by each invocation that hands on")
    calls: list[ExtraCall] = Field(description="every worker's calls of handing on, per iteration")
    bytes_read: int = Field(description="S3, every worker's continuations of one iteration")
    bytes_written: int
    seconds: float = Field(description="what handing on adds to a round")

    @property
    def handed_on(self) -> int:
        """Times one round is handed on."""
        return self.invocations - 1


def continuations(
    w: Workload,
    p: Parameters,
    traffic: RoundTraffic,
    timeout_s: float,
    setup_s: float,
    compute_s: float,
    read_weights_s: float,
    micro_batches: int,
) -> Continuations:
    """The continuations of one round of ``compute_s`` compute (its samples read meanwhile), each of its steps in
    ``micro_batches`` micro-batches, in Worker invocations of ``timeout_s``, each first spending ``setup_s`` (what it
    reads before computing), as the worker's pacer decides them (``progress.Pacer``): an invocation computes
    micro-batches while the time left is above ``progress.reserve_s``, and one at least. What it hands on is the local
    steps' weights and optimizer state (a rule of local steps) and, where a step has several micro-batches, those
    added up so far."""
    spec, rule = w.training, rules.of(w.training)
    K, M = traffic.compute_steps, 4 * w.params
    total = K * micro_batches
    stored = progress.stored_bytes(
        w.params,
        w.trainable_params,
        spec.local_optimizer_config(),
        K,
        w.metric_values,
        local_weights=ALGORITHMS[spec.algorithm].local,
        partial=micro_batches > 1,
    )
    micro_s = compute_s / total
    usable = timeout_s - setup_s - progress.reserve_s(stored, micro_s, p.s3_write_mb_s)
    invoked, per = invocations(total, micro_s, usable)
    handed = invoked - 1
    reread = traffic.residual_bytes + (traffic.slot_bytes if rule.rereads_slot else 0)
    W = w.workers
    reads = 2 + w.reducers + bool(traffic.residual_bytes) + (rule.rereads_slot and bool(traffic.slot_bytes))
    read = (", the slot's residual" if traffic.residual_bytes else "") + (
        ", the slot's state" if rule.rereads_slot and traffic.slot_bytes else ""
    )
    calls = [
        ExtraCall(operation=operation, count=W * handed * count, call=call, reason=HAND_ON_REASON)
        for operation, count, call in hand_on_calls(stored, reads, read)
        if handed
    ]
    hand_on_s = (
        write_s(w, p, stored)
        + p.dynamodb_s
        + p.sns_publish_s
        + p.sns_lambda_s
        + p.handler_s
        + 3 * p.dynamodb_s
        + p.s3_request_s
        + transfer(1, stored, p.s3_request_s, p.s3_read_mb_s)
        + read_weights_s
    )
    return Continuations(
        timeout_s=timeout_s,
        invocations=handed + 1,
        micro_batches_per_invocation=per,
        progress_bytes=stored,
        calls=calls,
        bytes_read=W * handed * (stored + M + reread),
        bytes_written=W * handed * stored,
        seconds=handed * hand_on_s,
    )


HAND_ON_REASON = "the round outlasts the Worker's timeout: it goes on in fresh invocations of the same attempt"


def invocations(units: int, unit_s: float, usable_s: float) -> tuple[int, int]:
    """The invocations a round of ``units`` units of ``unit_s`` each takes as the pacer hands it on
    (``progress.Pacer``), and the units an invocation computes: units while ``usable_s`` (an invocation's time less
    what it keeps for handing on) lasts, one at least."""
    per = units if unit_s == 0 else min(units, 1 + math.floor(max(0.0, usable_s) / unit_s))
    return math.ceil(units / per), per


def hand_on_calls(stored: int, reads: int, read: str = "") -> list[tuple[str, int, str]]:
    """The calls of one hand-on of a progress of ``stored`` bytes, whose fresh invocation makes ``reads`` GETs (the
    progress, the weights entering the round, and ``read``, what else it reads, in words): (operation, count, call)."""
    return [
        *(
            (operation, count, "the progress each invocation that hands its round on stores")
            for operation, count in creates(1, stored).items()
        ),
        ("dynamodb:UpdateItem", 1, "its record that the round goes on (the watchdog waits for it)"),
        ("sns:PublishBatch", 1, "its Work message to the fresh invocation"),
        ("dynamodb:PutItem", 1, "the continuation's record, handled once"),
        ("dynamodb:UpdateItem", 1, "the continuation's record, completed"),
        (
            "s3:GetObject",
            reads,
            "the continuation's reads: the progress, the weights entering the round (the manifest, the shards)" + read,
        ),
    ]


def in_micro_batches(count: int, micro_batch: int) -> str:
    """``count`` micro-batches of ``micro_batch`` samples at most, in words."""
    samples = "1 sample" if micro_batch == 1 else f"≤ {micro_batch:,} samples"
    return f"{count:,} micro-batch{'' if count == 1 else 'es'} of {samples}"


def step_in_words(micro_batch: int, micro_batches: int) -> str:
    """How a worker computes its step's share, in words: at once, or in micro-batches."""
    return "at once" if micro_batches == 1 else f"in {in_micro_batches(micro_batches, micro_batch)}"


def handed(handing: Continuations, micro_batch: int, micro_batches: int) -> str:
    """What each invocation of a round handed on computes, in words: local steps of one micro-batch each, else
    micro-batches."""
    per = handing.micro_batches_per_invocation
    return f"{per:,} local step{'' if per == 1 else 's'}" if micro_batches == 1 else in_micro_batches(per, micro_batch)
