"""Reducer: average one shard of the participants' updates and step the optimizer on it. Under a read
quorum below 1 (``slsml.spec.reliability.ReadPolicy``), parts whose reads time out are left out and recorded.

A shard's weights and optimizer state are one object (``slsml.training.shards``), written create-only: the
first try to store it wins, whether a retry averaged other parts or the watchdog kept the weights,
and every later try announces what is stored.

Runs that clip by norm across shards (``slsml.training.clipping``) step in two halves: each reducer stores its
average and its sums of squares and counts them on the iteration's counter; the reducer whose sums
complete the set steps its shard and releases the others' steps, once, with the totals (one more Reduce
message per shard, which steps with the stored average). A shard whose sums never come is re-launched
by the watchdog like any missing shard; past its retries, the shards still waiting keep their weights.

Under loss scaling (``slsml.training.precision``) every reducer reads each participant's loss scale and whether its
gradient was finite with its part: if one was not, every shard skips the step, and each stores the same next scale.

An update that is not the object its worker reported (its ETag) is refused and counted, and its worker's round is
re-launched, once, under the same inputs (a synchronous run's): the reduce gives way to the one its fresh update's
report fires again (``reduce_launcher``). A second refusal of that round's update fails the run naming it. Of a round
in pipeline stages, the update is an index of the stages' parts (``updates.StagedIndex``): a part that is not the
object the index names (its ETag) is refused so too, by the reducers whose shards it spans.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import NoReturn

import numpy as np
from aws_lambda_powertools import Logger

from slsml import rules
from slsml.aws.storage import Stored
from slsml.pipeline import signed
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import initial_shard, named_shard, refused, run_config
from slsml.spec import keys, wiring
from slsml.spec.compression import Compression
from slsml.spec.config import RunConfig
from slsml.spec.errors import RunFailed
from slsml.spec.messages import Participant, ReduceDone, ReduceMessage, WorkMessage
from slsml.spec.reliability import ReadPolicy
from slsml.state.barrier import next_version, quorum_count
from slsml.training import clipping, optimizers, precision, shards, updates

logger = Logger(child=True)


RELAUNCH_RECORD_WAIT_S = 5.0  # how long a re-launch claimed by another reducer may take to record its next attempt


class Redone(Exception):
    """A participant's update was refused and its worker's round re-launched: this reduce gives way to the one the
    fresh update's report fires."""


def reduce(message: ReduceMessage, services: Services) -> ReduceDone | None:
    """Average and step the shard; None if the step waits for the other shards' sums of squares (runs
    that clip by norm), to be released by the shard whose sums complete the set, or if it gives way to a reduce
    fired again with a re-launched round's update (``Redone``)."""
    config = run_config(services, message.run_id)
    try:
        return _reduce(message, config, services)
    except Redone:
        return None


def _reduce(message: ReduceMessage, config: RunConfig, services: Services) -> ReduceDone | None:
    run, iteration, shard = message.run_id, message.iteration, message.shard
    size = config.plan.shard(shard).size
    if message.squares is not None:  # released after the exchange: step with the stored average
        with ThreadPoolExecutor(max_workers=1) as pool:
            shard_read = pool.submit(_current, message, services, size)
            average = shards.decode(signed.read(services, run, keys.mean(run, iteration, shard)), size)
            return _step(message, config, services, shard_read.result(), average, message.squares)
    if clipping.needs_exchange(rules.server_optimizer(config), config.plan):
        exchanged = _exchange(message, config, services, _average(message, config, services))
        if exchanged is None:
            return None
        return _step(message, config, services, _current(message, services, size), *exchanged)
    with ThreadPoolExecutor(max_workers=1) as pool:  # the shard is read while the parts are
        shard_read = pool.submit(_current, message, services, size)
        average = _average(message, config, services)
        current = shard_read.result()
    return _step(message, config, services, current, average, None)


def _current(message: ReduceMessage, services: Services, size: int) -> shards.Shard:
    """The shard entering the message's iteration, read with the iteration's manifest (past the first: the Merger's,
    by its proof of origin), which must name it by its ETag (``common.named_shard``; of the first, run.json:
    ``common.initial_shard``): RunFailed naming it if not."""
    run, iteration, shard = message.run_id, message.iteration, message.shard
    key = keys.shard(run, iteration, shard)
    if iteration == 0:  # split from the run's initial model by its start: run.json names it
        initial = services.store.read(key)
        initial_shard(run_config(services, run), shard, initial)
        return shards.decode(initial.body, size)
    manifest, read = services.store.get_quorum([keys.manifest(run, iteration), key], [None, None], 2, 0)
    assert manifest is not None and read is not None  # every read is needed: none is left out
    named_shard(services.keys, run, iteration, shard, manifest, read)
    return shards.decode(read.body, size)


def _step(
    message: ReduceMessage,
    config: RunConfig,
    services: Services,
    current: shards.Shard,
    average: shards.Shard,
    squares: clipping.Squares | None,
) -> ReduceDone:
    """Clip the averaged gradient, step the optimizer, store the shard of the next iteration and announce it."""
    run, iteration, shard = message.run_id, message.iteration, message.shard
    trainable, mean, server = config.plan.shard(shard).trainable, average.weights, rules.server_optimizer(config)
    if average.skipped:  # a gradient was not finite under loss scaling: every shard skips the step
        assert average.loss_scale is not None  # a step is skipped under loss scaling only
        stepped, state = current.weights[trainable], current.state
        logger.info(
            "step skipped: a gradient was not finite under loss scaling",
            extra={"run_id": run, "iteration": iteration, "shard": shard, "next_scale": asdict(average.loss_scale)},
        )
    else:
        gradient = clipping.clip(server, config.plan, shard, mean, squares)
        decays = config.plan.mask(shard, lambda v: server.decays(v.name))[trainable]
        stepped, state = optimizers.apply(
            server,
            current.weights[trainable],
            gradient[trainable],
            current.state,
            decays,
            frozen=config.moments_frozen(iteration),
        )
    following = next_version(iteration, len(message.participants), config.training.asynchronous)
    if following == config.training.iterations:  # the final shard
        stepped = optimizers.finalize(server, stepped, state)
    weights = current.weights.copy()
    weights[trainable] = stepped
    weights[~trainable] = mean[~trainable]  # non-trainable state (e.g. BatchNorm statistics): averaged
    body = shards.encode(
        shards.Shard(weights, state, average.averaged, loss_scale=average.loss_scale, skipped=average.skipped)
    )
    stored = services.store.put_new(keys.shard(run, following, shard), body)
    dropped = [p.worker for p in message.participants if p.worker not in average.averaged]
    if stored and dropped:  # else another try's shard stands, and with it what that try left out
        services.table.record_dropped_parts(run, iteration, shard, dropped)
    done = ReduceDone(
        run_id=run, iteration=iteration, generation=message.generation, shard=shard, updates=len(message.participants)
    )
    services.bus.publish(wiring.REDUCE_DONE, [done])
    return done


def _exchange(
    message: ReduceMessage, config: RunConfig, services: Services, average: shards.Shard
) -> tuple[shards.Shard, clipping.Squares] | None:
    """Store the shard's average and its sums of squares, and count them. If every shard's are in, release
    the other shards' steps (once) and return this shard's average with the totals; else None."""
    table = services.table
    run, iteration, shard = message.run_id, message.iteration, message.shard
    if not signed.put(services, run, keys.mean(run, iteration, shard), shards.encode(average)):
        average = shards.decode(signed.read(services, run, keys.mean(run, iteration, shard)))  # another try's stands
    squares = clipping.shared_squares(rules.server_optimizer(config), config.plan, shard, average.weights)
    counter = table.record_squares(run, iteration, shard, message.generation, squares)
    if counter is None or counter.squares_in < config.reducers:
        return None
    contributions = table.shard_squares(run, iteration, config.reducers)
    if len(contributions) < config.reducers:
        return None  # the count ran ahead of the records (a retry counted twice)
    totals = clipping.totals(contributions)
    if table.release_steps(run, iteration, shard, message.generation):
        services.bus.publish(
            wiring.REDUCE,
            [message.model_copy(update={"shard": r, "squares": totals}) for r in range(config.reducers) if r != shard],
        )
    return average, totals


def _average(message: ReduceMessage, config: RunConfig, services: Services) -> shards.Shard:
    """The samples-weighted mean of the participants' parts of the shard, with the workers whose parts were
    read in time (the others are left out)."""
    run, iteration, shard = message.run_id, message.iteration, message.shard
    policy, participants, kind = ReadPolicy(), message.participants, rules.of(config.training).kind
    computed = [iteration if p.iteration is None else p.iteration for p in participants]
    where = [keys.update(run, i, p.worker, p.attempt) for i, p in zip(computed, participants, strict=True)]
    sent = [config.compression_at(i) for i in computed]  # a late update of the warm-up went dense
    need = quorum_count(len(participants), policy.quorum)
    if config.stage_blocks is not None:
        parts = _read_staged_parts(message, services, where, computed, config, need, policy)
    elif any(c.tabled for c in sent):
        parts = _read_tabled_parts(message, services, where, sent, config, need, policy)
    else:
        ranges = [updates.part_range(config.plan, shard, c) for c in sent]
        parts = services.store.get_quorum(where, ranges, need=need, timeout_s=policy.timeout_s)
    dropped = [p.worker for p, part in zip(participants, parts, strict=True) if part is None]
    if dropped:
        logger.warning(
            "parts dropped after their read timeout",
            extra={
                "run_id": run,
                "iteration": iteration,
                "shard": shard,
                "workers": dropped,
                "timeout_s": policy.timeout_s,
            },
        )
    included, decoded, reports = [], [], []
    for participant, key, part, compression in zip(participants, where, parts, sent, strict=True):
        if part is None:
            continue
        _check_named(participant, key, part, message, config, services)
        try:  # every part is checked and decoded before any is used
            updates.check(part.metadata, kind, key, compression)
            report = precision.reported(part.metadata)
            values = updates.decode_part(part.body, config.plan, shard, compression)
        except updates.UpdateFormatError as error:
            raise RunFailed(str(error) if str(error).startswith(key) else f"{key}: {error}") from None
        if participant.iteration is not None and report is not None and not report.finite:
            continue  # a late update whose gradient was not finite: its own step was skipped, it is left out
        included.append(participant)
        decoded.append(values)
        reports.append(report)
    try:
        scale, finite = precision.agree([r for p, r in zip(included, reports, strict=True) if p.iteration is None])
    except ValueError as error:
        raise RunFailed(f"iteration {iteration}: {error}") from None
    weights = [_weight(p, iteration, config.training.staleness_decay) for p in included]
    total = sum(weights)
    if total == 0:
        raise RunFailed(f"iteration {iteration}: the participating workers processed no samples")
    mean = np.zeros(config.plan.shard(shard).size, dtype=np.float64)
    for weight, values in zip(weights, decoded, strict=True):  # in message order: the same sums as long as
        mean += values.astype(np.float64) * weight  # nothing is dropped
    average = (mean / total).astype(np.float32)
    if not finite:  # the step is skipped: only the non-trainable values (e.g. BatchNorm statistics) are taken
        average[config.plan.shard(shard).trainable] = 0
    following = None if scale is None else scale.after(finite, config.optimizer.dynamic_growth_steps)
    return shards.Shard(average, {}, [p.worker for p in included], loss_scale=following, skipped=not finite)


def _check_named(
    participant: Participant, key: str, read: Stored, message: ReduceMessage, config: RunConfig, services: Services
) -> None:
    """``refused`` unless ``read`` (bytes of the update at ``key``) is of the update the participant's worker reported:
    the object of the ETag its signed report named (every GET answers the object's ETag, a ranged one too). A refused
    update's round is re-launched once (``Redone``): the run fails if it was, and this is its update."""
    if read.etag != participant.etag:
        why = f"is not the update worker {participant.worker} reported (ETag {participant.etag})"
        _refuse(participant, key, why, message, config, services)


def _refuse(
    participant: Participant, key: str, why: str, message: ReduceMessage, config: RunConfig, services: Services
) -> NoReturn:
    """``refused``: the object at ``key`` (of ``participant``'s update) is not the one named (``why``); the round
    re-launched once (``Redone``), the run failed if it was."""
    failure = refused(key, why, run_id=message.run_id)
    if _relaunched(participant, message, config, services):
        raise Redone from failure
    raise failure


def _relaunched(participant: Participant, message: ReduceMessage, config: RunConfig, services: Services) -> bool:
    """Whether the round of ``participant``, whose update was refused, is re-launched: now (claimed once, under the same
    inputs: its batches and the weights entering the iteration, so that its fresh update is the one it had to be), or
    before, by another reducer's refusal. False if the update refused is the re-launched round's, or of a round that
    cannot be re-launched so (asynchronous, stale weights, a late update folded in)."""
    spec, run, iteration = config.training, message.run_id, message.iteration
    if spec.asynchronous or spec.stale_weights or participant.iteration is not None:
        return False
    claimed = services.table.redo_round(run, iteration, message.generation, participant.worker, participant.attempt)
    if claimed is None:
        return _relaunched_before(services, run, iteration, participant)
    attempt = participant.attempt + 1
    work = WorkMessage(
        run_id=run,
        iteration=iteration,
        generation=message.generation,
        worker=participant.worker,
        workers=claimed.workers or config.workers,
        attempt=attempt,
    )
    services.bus.publish(wiring.WORK, work.staged(spec.pipeline_stages))
    logger.warning(
        "update refused: its worker's round re-launched",
        extra={"run_id": run, "iteration": iteration, "worker": participant.worker, "attempt": attempt},
    )
    return True


def _relaunched_before(services: Services, run_id: str, iteration: int, participant: Participant) -> bool:
    """Whether another reducer's refusal re-launched the round of ``participant``: its claim (the counter's
    ``redone_rounds``, naming the worker and the attempt refused) and the worker's next attempt recorded are two writes,
    so a claim of this round whose record has not landed yet is waited on, for at most ``RELAUNCH_RECORD_WAIT_S``. A
    claim of the worker's earlier attempt means that ``participant`` is the round it re-launched: no wait."""
    deadline = time.monotonic() + RELAUNCH_RECORD_WAIT_S
    while True:
        if services.table.get_iteration(run_id, iteration).relaunched.get(participant.worker, 0) > participant.attempt:
            return True
        claimed = (
            f"{participant.worker}:{participant.attempt}" in services.table.get_counter(run_id, iteration).redone_rounds
        )
        if not claimed or time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _weight(participant: Participant, iteration: int, decay: float) -> float:
    """A part's weight in the mean: its samples, × ``decay`` per iteration of age for a late update folded in."""
    if participant.iteration is None:
        return participant.samples
    return participant.samples * decay ** (iteration - participant.iteration)


def _read_staged_parts(
    message: ReduceMessage,
    services: Services,
    where: list[str],
    computed: list[int],
    config: RunConfig,
    need: int,
    policy: ReadPolicy,
) -> list[Stored | None]:
    """Updates computed in pipeline stages (``updates.StagedIndex``): each participant's index (of the update it
    reported, by its ETag), then the ranges of the stages' parts that the message's shard spans, each of the part the
    index names; a participant's ranges joined are its part of the shard, with its index's metadata and ETag. An index
    read that times out under the read quorum leaves its participant out."""
    store, participants, shard = services.store, message.participants, message.shard
    indexes = store.get_quorum(where, [None] * len(where), need=need, timeout_s=policy.timeout_s)
    reads: list[tuple[int, str, tuple[int, int], str]] = []  # (participant, part's key, byte range, its ETag)
    for number, (index, participant) in enumerate(zip(indexes, participants, strict=True)):
        if index is None:
            continue
        key = where[number]
        _check_named(participant, key, index, message, config, services)  # of the update reported
        try:
            updates.check(index.metadata, rules.of(config.training).kind, key)
            staged = updates.StagedIndex.decode(index.body, config.plan)
        except updates.UpdateFormatError as error:
            raise RunFailed(str(error) if str(error).startswith(key) else f"{key}: {error}") from None
        w, a = participant.worker, participant.attempt
        for stage, start, stop in staged.ranges(config.plan, shard):
            part = keys.stage_values(message.run_id, computed[number], w, a, stage)
            reads.append((number, part, (start, stop - 1), staged.etags[stage]))
    found = store.read_many([key for _, key, _, _ in reads], [span for _, _, span, _ in reads])
    bodies: dict[int, list[bytes]] = {}
    for (number, key, _, etag), read in zip(reads, found, strict=True):
        if read.etag != etag:
            why = f"is not the part of the update worker {participants[number].worker} reported (ETag {etag})"
            _refuse(participants[number], key, why, message, config, services)
        bodies.setdefault(number, []).append(read.body)
    return [
        None if index is None else Stored(b"".join(bodies.get(number, [])), index.metadata, index.size, index.etag)
        for number, index in enumerate(indexes)
    ]


def _read_tabled_parts(
    message: ReduceMessage,
    services: Services,
    where: list[str],
    sent: list[Compression],
    config: RunConfig,
    need: int,
    policy: ReadPolicy,
) -> list[Stored | None]:
    """Significance and sparse updates (``slsml.training.updates``): the message's shard's two entries of each update's
    part table (of the update each participant reported, by its ETag), then the parts they point at (an update
    ``sent`` dense, of the warm-up, at its part's range); a read that times out under the read quorum leaves its
    participant out (each of the two rounds of reads waits up to the read timeout)."""
    store, participants, shard = services.store, message.participants, message.shard
    kind = rules.of(config.training).kind
    tabled = [n for n, compression in enumerate(sent) if compression.tabled]
    entries = store.get_quorum(
        [where[n] for n in tabled],
        [updates.table_range(config.plan, shard)] * len(tabled),
        need=min(need, len(tabled)),
        timeout_s=policy.timeout_s,
    )
    ranges = {n: updates.part_range(config.plan, shard, c) for n, c in enumerate(sent) if not c.tabled}
    for number, entry in zip(tabled, entries, strict=True):
        if entry is None:
            continue
        key = where[number]
        _check_named(participants[number], key, entry, message, config, services)  # of the update reported
        try:  # the header first: the table of an update of another encoding is no table
            updates.check(entry.metadata, kind, key, sent[number])
            ranges[number] = updates.significant_part_range(entry.body, config.plan, shard, entry.size)
        except updates.UpdateFormatError as error:
            raise RunFailed(str(error) if str(error).startswith(key) else f"{key}: {error}") from None
    read = sorted(ranges)
    parts = store.get_quorum(
        [where[n] for n in read], [ranges[n] for n in read], need=min(need, len(read)), timeout_s=policy.timeout_s
    )
    out: list[Stored | None] = [None] * len(where)
    for number, part in zip(read, parts, strict=True):
        out[number] = part
    return out


def keep_weights(services: Services, config: RunConfig, iteration: int, shard: int, following: int) -> bool:
    """No reducer of ``shard`` finished ``iteration`` in time: the shard enters the ``following`` model version with
    its weights and optimizer state unchanged. False if a late reducer stored its average first: it stands."""
    store, run = services.store, config.run_id
    current = shards.decode(store.get(keys.shard(run, iteration, shard)))
    kept = shards.Shard(current.weights, current.state, [], kept=True, loss_scale=current.loss_scale)
    if not store.put_new(keys.shard(run, following, shard), shards.encode(kept)):
        return False
    services.table.record_stale_shard(run, iteration, shard)
    return True
