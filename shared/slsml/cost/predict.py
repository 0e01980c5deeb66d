"""The analytic time and cost model of one training run (``predict``): requests, bytes, time per stage, dollars
and quotas of one iteration, each function's share, the first iteration, and what the worker's kind
(``slsml.cost.workers``) computes and bills. Pure arithmetic over the pipeline's request chain
(``slsml.cost.chain``).

The critical path of an iteration: the Merger's ModelMerged → WorkLauncher → the n-th worker's Work
message → Worker → ReduceLauncher (fires) → the last Reduce message → Reducer → Merger (merges) →
the next manifest. It can be no shorter than the DynamoDB floor: the iteration counter item takes
W + R + 3 writes, at most ``dynamodb_partition_wu_s`` a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import ValidationError

from slsml.accounting import prices
from slsml.cost.chain import (
    NormExchange,
    RoundTraffic,
    chain_extras,
    creates,
    minimum_chain,
    norm_exchange,
    option_extras,
    round_traffic,
    stored,
    superseded_deletes,
)
from slsml.cost.datatraffic import DataTraffic, data_traffic
from slsml.cost.messages import (
    done_bytes,
    largest_reduce,
    manifest_bytes,
    message_bytes,
    publish_batches,
    state_item_bytes,
)
from slsml.cost.parameters import Parameters, Quotas, described
from slsml.cost.plan import MEMORY_QUOTAS, FirstIteration, FunctionFigures, GoingOn, Plan, Stage
from slsml.cost.proofs import proof_cost
from slsml.cost.quotas import quota_checks
from slsml.cost.timing import transfer, units, vcpus
from slsml.cost.workerkind import WorkerKind
from slsml.cost.workerround import (
    Continuations,
    MicroBatches,
    continuations,
    handed,
    micro_batching,
    s3_mb_s,
    step_in_words,
    write_s,
)
from slsml.cost.workers import kind_of
from slsml.cost.workload import IMAGE_FUNCTIONS, PIPELINE, Workload, state_slots
from slsml.data.datasets import READS
from slsml.data.manifest import DEFAULT_SHARD_MB
from slsml.rounds import ahead
from slsml.spec import errors
from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import STAGE_FUNCTIONS
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits
from slsml.state import runtable as runstate
from slsml.state.barrier import quorum_count
from slsml.training import updates


def check(workload: Workload, parameters: Parameters, quotas: Quotas) -> None:
    """Raise BadInputError for settings that cannot run at all, naming the limit and by how much; not for a function
    over its memory, which the plan answers with its figures and the memory to give (``MEMORY_QUOTAS``)."""
    w = workload
    if w.workers > quotas.lambda_concurrency:
        raise BadInputError(
            f"{w.workers} workers need {w.workers} concurrent Lambda executions: over the account's concurrency "
            f"quota of {quotas.lambda_concurrency:,} by {w.workers - quotas.lambda_concurrency:,} "
            "(ask AWS for more and give --quota lambda_concurrency=N)"
        )
    if w.global_batch < w.workers:
        raise BadInputError(
            f"global batch {w.global_batch} is smaller than the {w.workers} workers by "
            f"{w.workers - w.global_batch}: every worker needs at least one sample"
        )
    if w.reducers > w.params:
        raise BadInputError(
            f"{w.reducers} reducers but the model has only {w.params} weights: "
            f"{w.reducers - w.params} reducers would own no shard; give --reducers {w.params} or fewer"
        )
    if w.samples is not None and w.global_batch > w.samples:
        raise BadInputError(
            f"global batch {w.global_batch} is larger than the {w.samples} training samples: give --batch {w.samples}"
            " or less"
        )
    try:
        TrainingSpec.model_validate(w.run_spec.model_dump(exclude={"min_workers", "max_workers", "objective"}))
    except ValidationError as error:
        raise BadInputError(errors.described(error)) from None
    stages = RunLimits(function_timeouts_s={name: w.timeout_s[name] for name in STAGE_FUNCTIONS})
    if refusal := stages.deadline_refusal(w.training.deadline_s):  # the deployment FAILS such a run at its start
        raise BadInputError(refusal)
    plan = predict(workload, parameters, quotas, prices.PriceTable())
    problems = [q.detail for q in plan.quotas if q.hard and not q.ok and q.name not in MEMORY_QUOTAS]
    if problems:
        raise BadInputError("; ".join(problems))


def predict(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> Plan:
    """The plan of one configuration: requests, bytes, time and dollars per iteration; quotas."""
    w, p = workload, parameters
    kind = kind_of(w)
    s = sizes(w, p)
    W, R, n = s.workers, s.reducers, s.participants
    requests = _steady_requests(w, s)
    times = _pipeline_times(w, p, s)
    worker = _worker_times(w, p, quotas, s, kind, times)
    handing = worker.handing
    if worker.polls:
        requests["s3:HeadObject"] = W * worker.polls
    invocations = 1 + 2 * W + 2 * R + s.exchange.released + W * handing.handed_on
    counted = invocations if w.training.budget_usd is not None else 0  # each adds its cost to the run's spend
    for operation, count in (
        *s.exchange.requests.items(),
        *s.traffic.worker_requests(W).items(),
        *((e.operation, e.count) for e in option_extras(R, n, s.traffic, counted)),
        *((e.operation, e.count) for e in handing.calls),
    ):
        requests[operation] = requests.get(operation, 0) + count
    units = _units(p, s, handing.handed_on, counted)
    stages = _stages(w, p, s, worker, times, kind)
    chain_s = sum(stage.seconds for stage in stages)
    floor_s = units.counter / quotas.dynamodb_partition_wu_s
    gone = going_on(w, p, worker, _worker_timeout(w, quotas), _sides(stages, times.fire_s)[1])
    if gone is not None:  # each round an invocation goes on to: the model's HeadObject, the run's read, the take
        share = W * (1 - 1 / gone.rounds)
        for operation in ("s3:HeadObject", "dynamodb:GetItem", "dynamodb:UpdateItem"):
            requests[operation] = requests.get(operation, 0) + math.ceil(share)
        invocations -= math.floor(share)
    overlap_s = overlapped(w, stages, times.fire_s, gone)
    iteration_s = max(chain_s if overlap_s is None else overlap_s, floor_s)
    critical = {
        "work_launcher": times.launcher_s,
        "worker": worker.worker_s,
        "reduce_launcher": times.fire_s,
        "reducer": times.reducer_s,
        "merger": times.merge_s,
    }
    functions = _functions(w, p, s, worker, times, counted, critical, kind)
    dollars = price_table.cost(
        requests,
        read_units=units.read,
        write_units=units.write,
        gb_seconds=sum(f.gb_seconds for f in functions),
        invocations=invocations,
        publish_chunks={"sns:PublishBatch": units.sns_billed},
        log_bytes=invocations * p.log_bytes_per_invocation,
    )
    # what the worker's messages (WorkDone, and Work where a round is handed on) and logs carry out of its VPC
    endpoint_bytes = W * (
        s.report + handing.handed_on * s.work_message + handing.invocations * p.log_bytes_per_invocation
    )
    dollars |= kind.capacity_dollars(w, p, price_table, iteration_s, endpoint_bytes)
    first = first_iteration(w, p, price_table, s.model, s.model_file, s.local_batch, s.data)
    spreads = {"work": _publishing(p, s.work_batches), "reduce": _publishing(p, s.reduce_batches)}
    checks = quota_checks(
        w,
        p,
        quotas,
        n,
        largest_reduce(w.run_spec),
        {**critical, "worker": worker.worker_s / handing.invocations},  # each invocation's
        {f.function: f.memory_needed_mb for f in functions},
        lambda memory_mb: micro_batching(w, p, s.traffic, memory_mb),
        spreads,
        times.reduce_read,
        worker.read_weights,
        chain_s,
        floor_s,
        units.counter,
        s.data,
        (sum(creates(1, s.update).values()), sum(creates(1, s.traffic.shard_bytes).values())),
    )
    per_epoch = w.iterations_per_epoch
    minimum = minimum_chain(W, R, n, s.work_batches, s.reduce_batches, s.traffic, requests["s3:DeleteObjects"])
    minimum["s3:GetObject"] += s.data_gets  # the samples used are read however the pipeline runs
    return Plan(
        workload=w,
        participants=n,
        state_slots=s.slots,
        requests_per_iteration=requests,
        minimum_requests_per_iteration=minimum,
        data=s.data,
        extra_calls=[*chain_extras(W, R, n, s.traffic, counted), *handing.calls],
        micro_batch=s.steps.size,
        micro_batches=s.steps.per_step,
        continuations=handing,
        read_units=units.read,
        write_units=units.write,
        sns_billed_publishes=units.sns_billed,
        stages=stages,
        functions=functions,
        chain_s=chain_s,
        floor_s=floor_s,
        overlap_s=overlap_s,
        going_on=gone,
        iteration_s=iteration_s,
        epoch_s=None if per_epoch is None else per_epoch * iteration_s,
        run_s=w.iterations * iteration_s + first.extra_s,
        dollars_per_iteration=dollars,
        first_iteration=first,
        quotas=checks,
        parameters=described(p),
        worker=kind.figures(w, p, price_table),
        proofs=proof_cost(W, R, price_table),
    )


@dataclass(frozen=True)
class Sizes:
    """One iteration's counts and bytes, before any time is spent (the names of ``slsml.cost.chain``'s table)."""

    workers: int  # W
    reducers: int  # R
    participants: int  # n
    slots: int  # k: the reducers' optimizer state arrays
    model: int  # M: the float32 weights
    model_file: int  # F
    update: int  # U: one worker's update object
    manifest: int
    slot: int  # a worker slot's stored state
    residual: int  # a worker slot's error-feedback residual
    shard_weights: int  # the largest shard: the reducer on the critical path
    part: int  # its part of one update
    shard_state: int  # its optimizer state, at most (every weight trainable)
    mean_weights: float
    mean_state: float
    local_batch: int  # a worker's share of the batch
    work_message: int
    reduce_message: int
    report: int  # a WorkDone message
    record: float  # a worker's record item, with its metrics' state
    counter: float  # the iteration counter item, with the metrics' state it gets at the fire
    work_batches: int
    reduce_batches: int
    pages: int  # BatchGetItem calls of the fire: it reads the W records by key
    traffic: RoundTraffic
    steps: MicroBatches
    data: DataTraffic | None
    data_gets: int
    exchange: NormExchange


def sizes(w: Workload, p: Parameters) -> Sizes:
    """The iteration's sizes of workload ``w``."""
    W, R = w.workers, w.reducers
    n = quorum_count(W, w.quorum)
    traffic = round_traffic(w, p)
    k = state_slots(traffic.server)
    M = 4 * w.params
    local_batch = math.ceil(w.global_batch / W)
    work_bytes, reduce_bytes = message_bytes(n, local_batch, R)
    state_b = state_item_bytes(w.metric_values)  # on each worker's record, and on the counter from the fire on
    data = workload_data(w, p)
    return Sizes(
        workers=W,
        reducers=R,
        participants=n,
        slots=k,
        model=M,
        model_file=w.model_file_bytes,
        update=traffic.update_bytes,
        manifest=manifest_bytes(R),
        slot=traffic.slot_bytes,
        residual=traffic.residual_bytes,
        shard_weights=4 * math.ceil(w.params / R),
        part=traffic.part_bytes,
        shard_state=k * 4 * min(math.ceil(w.params / R), w.trainable_params),
        mean_weights=M / R,
        mean_state=k * 4 * w.trainable_params / R,
        local_batch=local_batch,
        work_message=work_bytes,
        reduce_message=reduce_bytes,
        report=done_bytes(W, local_batch * w.training.local_batches, w.metric_values),
        record=p.record_bytes + state_b,
        counter=p.counter_item_bytes + state_b,
        work_batches=publish_batches(W, work_bytes),
        reduce_batches=publish_batches(R, reduce_bytes),
        pages=math.ceil(W / runstate.BATCH_READ),
        traffic=traffic,
        steps=micro_batching(w, p, traffic, w.memory_mb["worker"]),
        data=data,
        data_gets=round(data.gets_per_iteration) if data else 0,
        exchange=norm_exchange(traffic, R, reduce_bytes),
    )


def _steady_requests(w: Workload, s: Sizes) -> dict[str, int]:
    """The requests of the chain's table, before what the run's options and continuations add."""
    W, R, n = s.workers, s.reducers, s.participants
    # stale_weights: the fire reads the run (held?), its launch of the next round the run, the merge's launch claim
    # finds it launched and the Merger reads the held reduce's counter and reports; each worker reads one model a
    # round, as a synchronous one does: the one before its round's, which it predicts from too, is warm
    # (``slsml.rounds.ahead``)
    stale = w.training.stale_weights
    return {
        "dynamodb:GetItem": 1 + 3 * stale,
        "dynamodb:UpdateItem": 1 + W + 1 + R + 2 + stale,
        "dynamodb:PutItem": W + 1,
        "dynamodb:BatchGetItem": s.pages * (1 + stale),
        "s3:GetObject": W * (R + 1) + R * (n + 2) + s.data_gets,
        "s3:ListObjectsV2": 1,
        **stored(W, R, s.traffic),
        "s3:DeleteObjects": superseded_deletes(w.training, R, s.traffic),
        "sns:PublishBatch": s.work_batches + W + s.reduce_batches + R + 1,
    }


def _publishing(p: Parameters, batches: int) -> float:
    """Seconds of ``batches`` PublishBatch calls, ``sns_parallel_publishes`` at a time."""
    return math.ceil(batches / p.sns_parallel_publishes) * p.sns_publish_s


@dataclass(frozen=True)
class WorkerTimes:
    """The Worker's part of the critical path."""

    read_weights: float  # the R shards (the manifest's read alongside) of the models a round enters, on the path
    read_model: float  # one model's R shards, wherever they are read
    polls: int  # stale_weights: the HeadObjects a round makes looking for the next model's manifest (0: none)
    compute_s: float  # its round's gradients, as its kind computes them
    first_s: float  # the read of its round's first micro-batch, alongside the weights
    last_s: float  # the compute of its round's last micro-batch
    streamed_s: float  # the round's compute and the data reads behind it
    slot_s: float
    residual_read: float
    write_update: float
    worker_s: float  # the invocation on the path, continuations included
    handing: Continuations


def _worker_times(
    w: Workload, p: Parameters, quotas: Quotas, s: Sizes, kind: WorkerKind, times: PipelineTimes
) -> WorkerTimes:
    """The Worker's reads, compute (``kind``'s), writes and continuations."""
    lat, ddb = p.s3_request_s, p.dynamodb_s
    traffic, steps = s.traffic, s.steps
    # the R shards, s3_parallel_reads at a time, at the worker's S3 rate (its kind's: a GPU worker's instance's)
    weights_mb_s = s3_mb_s(w, p, min(s.reducers, p.s3_parallel_reads))[0]
    one = transfer(s.reducers, s.model, lat, weights_mb_s, p.s3_parallel_reads)
    compute_s = kind.compute_s(w, p, traffic.compute_steps * s.local_batch)
    # the samples are read a micro-batch at a time, ahead of the one computing: the first with the weights, the
    # others while the micro-batches before them compute
    data_s = s.data.read_s if s.data else 0.0
    first_s = data_s / (traffic.compute_steps * steps.per_step)
    streamed_s = max(compute_s, data_s - first_s)
    # the rule's round reads the slot's state before its steps and stores the new one after them; the residual
    # is read alongside the round and stored before the update
    slot_s = 2 * transfer(1, s.slot, lat, p.s3_read_mb_s) if s.slot else 0.0
    residual_read, residual_write = (
        (transfer(1, s.residual, lat, p.s3_read_mb_s), write_s(w, p, s.residual)) if s.residual else (0.0, 0.0)
    )
    round_s = max(slot_s + streamed_s, residual_read)
    write_update = residual_write + write_s(w, p, s.update)
    # ddb: the Work's check
    rest_s = p.handler_s + ddb + round_s + write_update + p.sns_publish_s
    read_weights, polls = one, 0
    if w.training.stale_weights:  # the models a round enters: the one before warm, the other read ahead
        read_weights, polls = _read_ahead(p, s, times, one, first_s + rest_s)
    read_s = max(read_weights, first_s)
    worker_timeout = _worker_timeout(w, quotas)
    # a round that outlasts the Worker's timeout goes on in fresh invocations, which read the weights themselves
    handing = continuations(
        w,
        p,
        traffic,
        worker_timeout,
        p.handler_s + ddb + read_s,
        streamed_s,
        (1 + w.training.stale_weights) * one,
        steps.per_step,
    )
    return WorkerTimes(
        read_weights=read_weights,
        read_model=one,
        polls=polls,
        compute_s=compute_s,
        first_s=first_s,
        last_s=compute_s / (traffic.compute_steps * steps.per_step),
        streamed_s=streamed_s,
        slot_s=slot_s,
        residual_read=residual_read,
        write_update=write_update,
        worker_s=read_s + rest_s + handing.seconds,
        handing=handing,
    )


def _worker_timeout(w: Workload, quotas: Quotas) -> float:
    """The Worker's timeout: the deployment's, at most Lambda's."""
    return min(w.timeout_s["worker"], quotas.lambda_timeout_s)


def going_on(w: Workload, p: Parameters, worker: WorkerTimes, timeout_s: float, reduce_side: float) -> GoingOn | None:
    """``stale_weights``: the rounds a worker's invocation goes on to (``slsml.pipeline.steps.worker.going_on``), none
    where a round outlasts one invocation or the workers are tuned. A round it goes on to skips the invocation's start
    and adds its checks, its first micro-batch is read as the round before's last computes, and the update of the round
    before is stored and announced as it computes; the invocation goes on while ``GO_ON_ROUNDS`` such rounds' time is
    left of its ``timeout_s``, its first round (with its start) done, and where the model the round enters is merged
    within a round's time of the round before's end (its report, then the ``reduce_side``)."""
    spec = w.training
    if not spec.stale_weights or spec.workers == "auto" or worker.handing.handed_on:
        return None
    stored = worker.write_update + p.sns_publish_s  # as the next round computes
    # its first micro-batch read as the round before's last computed, its weights ahead as ever
    read = max(worker.read_weights, worker.first_s - worker.last_s)
    launched = max(worker.read_weights, worker.first_s)
    period = worker.worker_s - p.handler_s - stored - launched + read + p.s3_request_s + 2 * p.dynamodb_s
    left = timeout_s - worker.worker_s - ahead.GO_ON_ROUNDS * period
    rounds = 1 + (math.floor(left / period) + 1 if left >= 0 else 0)
    reported = stored + p.sns_lambda_s
    if reported + reduce_side > 2 * period:  # the model a round enters would not be merged within a round's time
        return None
    return GoingOn(period_s=period, reported_s=reported, rounds=rounds)


def _read_ahead(p: Parameters, s: Sizes, times: PipelineTimes, one: float, invocation_s: float) -> tuple[float, int]:
    """``stale_weights``: (the seconds a round waits for the model it enters, the HeadObjects a round makes looking
    for the next one), as ``slsml.rounds.ahead`` reads it. The model a round enters is merged while the round
    before computes: from the fire that launched that round, the reducers and the Merger store its manifest, which
    that round's worker finds within ``ahead.POLL_S`` (half of it on average) of its storing, if its invocation has
    not ended, and reads; the next round starts that worker's invocation, the report, the fire and the launch after
    the same fire. What of the read outlasts that start is on the path; a manifest stored after the invocation
    ended is read by the next round itself. The model the round before entered is warm."""
    hop = p.sns_lambda_s
    started = times.launch_s + hop + p.handler_s  # from the fire: the worker looks from its invocation's start
    stored = sum(stage.seconds for stage in _reduce_stages(p, s, times))
    ended = started + invocation_s
    found = stored + ahead.POLL_S / 2
    if found > ended:
        return one, math.ceil(invocation_s / ahead.POLL_S)
    next_start = ended + hop + times.fire_s + times.launch_s + hop + p.handler_s + p.dynamodb_s
    return max(0.0, found + one - next_start), max(1, math.ceil((found - started) / ahead.POLL_S))


class Units(NamedTuple):
    """An iteration's DynamoDB units and SNS billed publishes."""

    counter: int  # the iteration counter item's write units
    write: int
    read: int
    sns_billed: int


def _units(p: Parameters, s: Sizes, handed_on: int, counted: int) -> Units:
    """The units of the iteration's items as DynamoDB bills them, and its publishes as SNS bills them (each 64 KB)."""
    W, R, n = s.workers, s.reducers, s.participants
    released = s.exchange.released
    # claim and counts; then the fire (the train metrics' state), shard counts, merge; with the norm exchange its
    # counts and release
    fired_writes = 1 + R + 1 + (R + 1 if released else 0)
    counter_units = (1 + W) * units(p.counter_item_bytes, 1024) + fired_writes * units(s.counter, 1024)
    write_units = (
        counter_units
        + W * units(s.record, 1024)  # the reports, with their metrics' state
        + ((R if released else 0) + 3 * W * handed_on) * units(p.record_bytes, 1024)
        + units(n * p.participant_bytes, 1024)
        + units(p.run_item_bytes, 1024)
        + counted
    )  # the spend item: a number
    read_units = (
        units(p.run_item_bytes, 4096)  # BatchGetItem: per item
        + W * units(s.record, 4096)
        + (R if released else 0) * units(p.record_bytes, 4096)
        + s.traffic.late_queries * units(W * s.record + s.counter, 4096)
        + bool(counted)
    )  # the launch's read of the spend
    sns_billed = (
        W * (1 + handed_on) * prices.sns_chunks(s.work_message)
        + W * prices.sns_chunks(s.report)
        + R * prices.sns_chunks(s.reduce_message)
        + R
        + 1  # +1: ModelMerged
        + released * prices.sns_chunks(s.exchange.release_bytes)
    )
    return Units(counter=counter_units, write=write_units, read=read_units, sns_billed=sns_billed)


@dataclass(frozen=True)
class PipelineTimes:
    """The other functions' invocations: the one on the critical path, and the others of an iteration."""

    launch_s: float  # the WorkLauncher up to the n-th worker's Work
    launcher_s: float  # all of its publishing
    count_s: float  # a ReduceLauncher that counts
    fire_s: float  # the one that fires
    reduce_read: float
    reduce_math: float
    reducer_s: float  # the largest shard's
    reducer_mean_s: float  # a mean shard's
    share_s: float  # the norm exchange's share and release (0: none)
    step_s: float  # a released reducer's step
    merge_s: float  # the merging Merger
    merger_count_s: float  # a Merger that counts


def _pipeline_times(w: Workload, p: Parameters, s: Sizes) -> PipelineTimes:
    """The launchers', reducers' and mergers' seconds (a launch reads the run's spend where it has a budget)."""
    budget = w.training.budget_usd is not None
    lat, ddb, pub = p.s3_request_s, p.dynamodb_s, p.sns_publish_s
    R, n = s.reducers, s.participants
    traffic, exchange = s.traffic, s.exchange
    # WorkLauncher: read the run (and its spend, with a budget), claim the iteration, publish Work (the n-th
    # message's batch is on the path)
    launch_s = p.handler_s + (2 + budget) * ddb + _publishing(p, publish_batches(n, s.work_message))
    launcher_s = p.handler_s + (2 + budget) * ddb + _publishing(p, s.work_batches)
    count_s = p.handler_s + lat + 2 * ddb  # lat: the WorkDone's check
    fire_s = count_s + ddb + s.pages * ddb + ddb + traffic.late_queries * ddb + _publishing(p, s.reduce_batches)

    def reducer(weights: float, state: float) -> tuple[float, float, float]:
        """(read, compute, total) seconds of one reducer of a shard of this size."""
        elements = weights / 4
        parts = n * s.part * weights / s.shard_weights  # the participants' parts of a shard of this size
        read = traffic.table_reads * transfer(n, 16 * n, lat, p.s3_read_mb_s, p.s3_parallel_reads) + transfer(
            n + 2, parts + weights + state, lat, p.s3_read_mb_s, p.s3_parallel_reads
        )
        cpu = min(1.0, vcpus(w.memory_mb["reducer"]))
        math_s = elements * (n * p.average_ns + p.optimizer_ns) * 1e-9 / cpu
        total = p.handler_s + ddb + read + math_s + transfer(1, weights + state, lat, p.s3_write_mb_s) + pub
        return read, math_s, total

    reduce_read, reduce_math, reducer_s = reducer(s.shard_weights, s.shard_state)
    share_s = step_s = 0.0
    if exchange.released:  # store the average, record + count + read the sums + claim, release; read back
        share_s = (
            transfer(1, s.shard_weights, lat, p.s3_write_mb_s)
            + (3 + math.ceil(R / runstate.BATCH_READ)) * ddb
            + _publishing(p, publish_batches(exchange.released, exchange.release_bytes))
        )
        step_s = p.handler_s + (
            transfer(2, 2 * s.shard_weights + s.shard_state, lat, p.s3_read_mb_s, p.s3_parallel_reads)
        )
    return PipelineTimes(
        launch_s=launch_s,
        launcher_s=launcher_s,
        count_s=count_s,
        fire_s=fire_s,
        reduce_read=reduce_read,
        reduce_math=reduce_math,
        reducer_s=reducer_s,
        reducer_mean_s=reducer(s.mean_weights, s.mean_state)[2],
        share_s=share_s,
        step_s=step_s,
        # the check, the count, the list of the shards, the fire and the advance, the manifest's PUT, its ModelMerged
        merge_s=p.handler_s + lat + ddb + lat + 2 * ddb + lat + pub,
        merger_count_s=p.handler_s + lat + ddb,
    )


def _stages(
    w: Workload, p: Parameters, s: Sizes, worker: WorkerTimes, times: PipelineTimes, kind: WorkerKind
) -> list[Stage]:
    """The critical path, stage by stage."""
    W, R, n = s.workers, s.reducers, s.participants
    traffic, steps, data, handing, hop = s.traffic, s.steps, s.data, worker.handing, p.sns_lambda_s
    return [
        Stage(
            name="model → WorkLauncher",
            function=None,
            seconds=hop,
            detail="ModelMerged: SNS → Lambda",
        ),
        Stage(
            name="WorkLauncher",
            function="work_launcher",
            seconds=times.launch_s,
            detail=f"run + claim (DynamoDB), Work to the {n}-th worker: {publish_batches(n, s.work_message)} of "
            f"{s.work_batches} PublishBatch, {p.sns_parallel_publishes:g} at a time",
        ),
        Stage(name="Work → Worker", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Worker",
            function="worker",
            seconds=worker.worker_s,
            detail=f"read weights ({R} shards) {worker.read_weights:.2f} s"
            + (
                f" (the model read ahead in {worker.read_model:.2f} s as the round before computed)"
                if worker.read_weights < worker.read_model
                else ""
            )
            + (
                f" and {data.gets_per_iteration / W:,.1f} data GETs {data.read_s:.2f} s (ahead of compute)"
                if data and data.gets_per_iteration
                else ""
            )
            + f", {w.training.algorithm}: compute "
            f"{traffic.compute_steps} × {s.local_batch} samples {worker.compute_s:.2f} s{kind.compute_detail(w)}"
            + (f" {step_in_words(steps.size, steps.per_step)}" if steps.per_step > 1 else "")
            + (f", slot state {worker.slot_s:.2f} s" if s.slot else "")
            + (f", residual read {worker.residual_read:.2f} s (alongside), written" if s.residual else "")
            + f", write update {worker.write_update:.2f} s, WorkDone"
            + (
                f"; in {handing.invocations} invocations of {handed(handing, steps.size, steps.per_step)}, handing on"
                f" {handing.seconds:.2f} s"
                if handing.handed_on
                else ""
            ),
        ),
        Stage(name="WorkDone → ReduceLauncher", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="ReduceLauncher (fires)",
            function="reduce_launcher",
            seconds=times.fire_s,
            detail=f"record + count, {s.pages} BatchGetItem, participants, "
            + (f"{traffic.late_queries} Query for late updates, " if traffic.late_queries else "")
            + f"fire, {s.reduce_batches} PublishBatch ({p.sns_parallel_publishes:g} at a time)",
        ),
        *_reduce_stages(p, s, times),
    ]


def _reduce_stages(p: Parameters, s: Sizes, times: PipelineTimes) -> list[Stage]:
    """The critical path after the fire: the reducers and the Merger, up to the next manifest."""
    traffic, n, hop, released = s.traffic, s.participants, p.sns_lambda_s, s.exchange.released
    return [
        Stage(name="Reduce → Reducer", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Reducer",
            function="reducer",
            seconds=times.reducer_s,
            detail=(f"{n} part-table GETs, then " if traffic.table_reads else "")
            + f"{n + 2} GETs {times.reduce_read:.2f} s, average + optimizer {times.reduce_math:.2f} s, write shard",
        ),
        *(
            [
                Stage(
                    name="Norm exchange",
                    function="reducer",
                    seconds=times.share_s + hop + times.step_s,
                    detail=f"store average + sums of squares, release {released} shards (SNS → Lambda), "
                    "read average and shard back",
                )
            ]
            if released
            else []
        ),
        Stage(name="ReduceDone → Merger", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Merger (merges)",
            function="merger",
            seconds=times.merge_s,
            detail="count, list the shards, advance, write the manifest, launch the next iteration (ModelMerged)",
        ),
    ]


def _sides(stages: list[Stage], fire_s: float) -> tuple[float, float]:
    """A stale-weights round's workers' side (the launch, the round, the report, the fire) and its reduce side (the
    reducers and the Merger of the round before, then the held reduce's fire)."""
    fires = next(i for i, stage in enumerate(stages) if stage.function == "reduce_launcher") + 1
    workers_side = sum(stage.seconds for stage in stages[1:fires])  # the hop from the Merger is not on it
    return workers_side, sum(stage.seconds for stage in stages[fires:]) + fire_s


def overlapped(w: Workload, stages: list[Stage], fire_s: float, gone: GoingOn | None) -> float | None:
    """``stale_weights``: an iteration's mean period. A round a worker's invocation goes on to (``gone``) starts as
    soon as that worker's round before has computed and the model it enters is merged: it takes the longer of its
    own period and the round before's report (stored, announced, delivered) with the reduce side after it (the
    reducers and the Merger of the round before, then the held reduce's fire). A
    round launched as the round before's reduce fires takes the longer of its workers' side (the launch, the round,
    the report, the fire: the stages from the WorkLauncher to the ReduceLauncher's) and the reduce side; an
    iteration whose workers evaluate the model entering it (every ``eval_every``) is launched by its merge, the whole
    chain. Of each ``eval_every`` iterations, one invocation in ``gone.rounds`` is launched. None without
    ``stale_weights``."""
    if not w.training.stale_weights:
        return None
    workers_side, reduce_side = _sides(stages, fire_s)
    ahead_s, chain = max(workers_side, reduce_side), sum(stage.seconds for stage in stages)
    every = w.training.eval_every or w.iterations
    launched = every if gone is None else math.ceil(every / gone.rounds)  # the merge's, then the fires'
    following = 0.0 if gone is None else (every - launched) * max(gone.period_s, gone.reported_s + reduce_side)
    return (chain + (launched - 1) * ahead_s + following) / every


def _functions(
    w: Workload,
    p: Parameters,
    s: Sizes,
    worker: WorkerTimes,
    times: PipelineTimes,
    counted: int,
    critical: dict[str, float],
    kind: WorkerKind,
) -> list[FunctionFigures]:
    """Each function's invocations, billed GB-seconds (the worker's as its ``kind`` bills them), S3 bytes and
    memory."""
    W, R, n, M, U = s.workers, s.reducers, s.participants, s.model, s.update
    handing, released = worker.handing, s.exchange.released
    durations = {  # (invocations, billed seconds of each) per function
        "work_launcher": [(1, times.launcher_s)],
        "worker": [(W * handing.invocations, worker.worker_s / handing.invocations)],
        "reduce_launcher": [(W - 1, times.count_s), (1, times.fire_s)],
        "reducer": [(R, times.reducer_mean_s + times.share_s), (released, times.step_s)],
        "merger": [(R - 1, times.merger_count_s), (1, times.merge_s)],
    }
    if counted:  # each invocation's addition to the spend, after its work (off the critical path)
        durations = {
            name: [(count, seconds + p.dynamodb_s) for count, seconds in runs] for name, runs in durations.items()
        }
    state_total = s.slots * 4 * w.trainable_params
    kept = s.slot + s.residual
    data_bytes = round(s.data.bytes_per_iteration) if s.data else 0
    io = {  # (read, written) bytes: the critical invocation, then all of one iteration
        "work_launcher": (0, 0, 0, 0),
        "worker": (
            M + kept + math.ceil(data_bytes / W) + handing.bytes_read // W,
            U + kept + handing.bytes_written // W,
            W * (M + kept) + data_bytes + handing.bytes_read,
            W * (U + kept) + handing.bytes_written,
        ),
        "reduce_launcher": (0, 0, 0, 0),
        "reducer": (
            n * s.part + s.shard_weights + s.shard_state,
            s.shard_weights + s.shard_state,
            n * (U - updates.HEADER_SIZE) + M + state_total,
            M + state_total,
        ),
        "merger": (0, s.manifest, 0, s.manifest),
    }
    memory_needed = {
        "work_launcher": p.python_runtime_mb,
        "worker": s.steps.needed_mb,
        "reduce_launcher": p.python_runtime_mb + W * s.record / 1e6,
        "reducer": p.python_runtime_mb
        + (n * max(s.part, s.shard_weights) + 8 * s.shard_weights / 4 + 2 * (s.shard_weights + s.shard_state)) / 1e6,
        # the final merge also holds the optimizer's slots (in Keras and in the saved file) and a shard's state
        "merger": p.tf_runtime_mb + (p.merger_model_copies * M + 2 * state_total + s.shard_state) / 1e6,
    }
    mem = w.memory_mb
    functions = []
    for name in PIPELINE:
        billed = kind.billed_gb_seconds if name == "worker" else prices.gb_seconds
        read, written, read_total, written_total = io[name]
        functions.append(
            FunctionFigures(
                function=name,
                invocations=sum(c for c, _ in durations[name]),
                memory_mb=mem[name],
                seconds=critical[name],
                gb_seconds=sum(count * billed(seconds, mem[name]) for count, seconds in durations[name]),
                bytes_read=read,
                bytes_written=written,
                bytes_read_total=read_total,
                bytes_written_total=written_total,
                memory_needed_mb=memory_needed[name],
            )
        )
    return functions


def workload_data(w: Workload, p: Parameters) -> DataTraffic | None:
    """The workers' data reads (``slsml.cost.datatraffic``), in the order they read (GPU workers: in blocks unless
    told otherwise, ``TrainingSpec.on_gpu_workers``) at their S3 rate; None without the samples and their bytes."""
    if w.samples is None or not w.sample_bytes:
        return None
    spec = w.training if w.accelerator is None else w.training.on_gpu_workers()
    return data_traffic(
        spec.shuffle,
        w.samples,
        w.sample_bytes,
        w.global_batch,
        w.workers,
        spec.local_batches,
        spec.shuffle_block,
        w.memory_mb["worker"],
        w.cache_mb,
        w.shard_records,
        p.s3_request_s,
        s3_mb_s(w, p, READS)[0],
    )


def first_iteration(
    w: Workload,
    p: Parameters,
    price_table: prices.PriceTable,
    M: int,
    F: int,
    local_batch: int,
    data: DataTraffic | None,
) -> FirstIteration:
    """Cold starts on the critical path (the worker's as its kind starts) and the reads only a cold container makes;
    the dollars of both, and what the workers' capacity bills meanwhile."""
    W, R = w.workers, w.reducers
    kind = kind_of(w)
    cold = {name: p.cold_start_image_s if name in IMAGE_FUNCTIONS else p.cold_start_zip_s for name in PIPELINE}
    cold["worker"] = kind.cold_start_s(w, p)
    load_model = F / (p.keras_mb_s * 1e6) / min(1.0, vcpus(w.memory_mb["worker"]))
    shards_each = 0.0
    data_s = 0.0
    notes = []
    if data is not None and data.cached:  # whole shards, once
        per_shard = min(data.shard_records, w.samples or data.shard_records)
        shards = math.ceil(data.samples / per_shard)
        shards_each = shards * (1 - (1 - 1 / shards) ** local_batch)  # distinct shards of a random slice
        shard_bytes = per_shard * data.sample_bytes
        data_s = shards_each * (p.s3_request_s + shard_bytes / (p.s3_read_mb_s * 1e6))
        notes.append(f"each worker reads {shards_each:.1f} dataset shards of {shard_bytes / 1e6:.0f} MB")
    elif data is not None:
        notes.append("the workers read the samples they use, as every iteration does (past their cache)")
    elif w.samples is not None:
        notes.append(
            f"each worker reads dataset shards of up to {DEFAULT_SHARD_MB:g} MB (their number unknown: --sample-bytes)"
        )
    # a cold worker reads run.json, the dataset's manifest and the model file, which holds the weights entering the
    # first iteration: not the manifest and the R shards a steady worker reads them from
    skipped = 1 + R
    worker_extra = (
        3 * p.s3_request_s
        - math.ceil(R / p.s3_parallel_reads) * p.s3_request_s
        + (F - M) / (p.s3_read_mb_s * 1e6)
        + load_model
        + data_s
    )
    # the merging Merger builds the run's metrics once, to turn the iteration's train metrics into results: it reads
    # the model file, the dataset's manifest and a test shard (two samples), and loads the model
    merger_extra = 3 * p.s3_request_s + F / (p.s3_read_mb_s * 1e6) + load_model
    # the first iteration is launched by the initial model's S3 event, the later ones by the Merger's message
    extra_s = p.s3_event_s + sum(cold.values()) + worker_extra + merger_extra
    gets = W * (3 + math.ceil(shards_each) - skipped) + W + R + R + 1  # workers; run.json of every other container
    gets += 3  # the merging Merger's model file, dataset manifest and test shard
    extra = {"s3:GetObject": gets}
    memory = w.memory_mb
    init_gbs = (
        prices.gb_seconds(cold["work_launcher"], memory["work_launcher"])
        + W * kind.billed_gb_seconds(cold["worker"] + worker_extra, memory["worker"])
        + W * prices.gb_seconds(cold["reduce_launcher"], memory["reduce_launcher"])
        + R * prices.gb_seconds(cold["reducer"], memory["reducer"])
        + R * prices.gb_seconds(cold["merger"], memory["merger"])
        + prices.gb_seconds(merger_extra, memory["merger"])
    )
    dollars = sum(price_table.cost(extra, gb_seconds=init_gbs).values())
    if capacity := kind.capacity_dollars(w, p, price_table, extra_s, 0.0):
        dollars += sum(capacity.values())
        notes.append(
            f"the workers' {kind.name} capacity is billed from its start: {prices.usd(sum(capacity.values()))}"
        )
    notes.insert(0, "cold starts on the path: " + ", ".join(f"{name} {s:g} s" for name, s in cold.items()))
    notes.insert(0, f"the initial model's S3 event launches it: {p.s3_event_s:g} s")
    notes.append(
        "every container reads run.json; the workers read the model file and the dataset's manifest, not the shards;"
        " the merging Merger reads the model file, the dataset's manifest and a test shard to build the run's metrics"
    )
    return FirstIteration(extra_s=extra_s, extra_requests=extra, extra_dollars=dollars, detail="; ".join(notes))
