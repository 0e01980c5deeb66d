"""ReduceLauncher: count finished workers; at the quorum, fire the reducers exactly once. Workers whose
update is non-finite count as arrived but are left out; if all of them are, the run fails. Reports
of an attempt the watchdog superseded are ignored."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from slsml.pipeline import metrics
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import run_config
from slsml.spec import wiring
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.messages import Participant, ReduceMessage, WorkDone
from slsml.state.barrier import quorum_count
from slsml.state.records import DEADLINE_OWNER

logger = Logger(child=True)


def on_work_done(done: WorkDone, services: Services) -> list[ReduceMessage]:
    """Record ``done``; return the reduce messages published (none unless this message fires the barrier)."""
    metrics.emit(Metric.WORKERS_DONE, 1)
    config = run_config(services, done.run_id)
    log = {"run_id": done.run_id, "iteration": done.iteration, "worker": done.worker, "attempt": done.attempt}
    counter = services.table.record_worker(done)
    if counter is None:
        logger.info("stale attempt ignored", extra=log)
        return []
    if counter.reduce_fired_by == done.worker:  # a copy of the report that fired: its reduce went out then
        logger.info("duplicate of the firing report ignored", extra=log)
        return []
    if counter.reduce_fired_by is not None:
        _late(log)
        return []
    finite, workers = counter.arrived - counter.nonfinite_arrived, counter.workers or config.workers
    if finite < quorum_count(workers, config.training.quorum) and counter.arrived < workers:
        return []
    return fire_reduce(services, config, done.iteration, workers, done.generation, done.worker, config.training.quorum)


def fire_reduce(
    services: Services, config: RunConfig, iteration: int, workers: int, generation: int, owner: int, quorum: float
) -> list[ReduceMessage]:
    """Fire the reduce of ``iteration`` with its finite reports, once, if at least ``quorum`` of its ``workers``
    (or all of them, non-finite ones included) reported: [] if not, or if someone else fired it."""
    table, run_id = services.table, config.run_id
    reports = table.worker_reports(run_id, iteration, workers, generation)
    finite = [r for r in reports if r.finite]
    if len(reports) >= workers and not finite:
        reason = f"all {workers} workers produced non-finite updates at iteration {iteration}"
        logger.error("run failed", extra={"run_id": run_id, "reason": reason})
        services.fail_run(run_id, reason)
        return []
    if not finite or (len(finite) < quorum_count(workers, quorum) and len(reports) < workers):
        return []  # the counter ran ahead of the records (a duplicate report counted twice)
    participants = [Participant(worker=r.worker, attempt=r.attempt, samples=r.samples, etag=r.etag) for r in finite]
    folded = _fold_late(services, config, iteration, generation)
    fired = table.freeze_participants(run_id, iteration, owner, participants + folded, generation)
    if fired is None:  # the run was resumed: a later generation fired it
        return []
    fired_by, participants = fired
    for late in set(folded) - set(participants):  # claimed for a reduce that fired without them: free again
        table.unfold(run_id, late, iteration)
    if fired_by != owner:  # another worker's message (or the watchdog) fired it first
        if owner != DEADLINE_OWNER and owner not in {p.worker for p in participants}:
            _late({"run_id": run_id, "iteration": iteration, "worker": owner})
        return []
    messages = publish_reduce(
        services,
        config,
        iteration,
        participants,
        generation,
        nonfinite=sorted(r.worker for r in reports if not r.finite),
    )
    table.mark_reduce_fired(run_id, iteration, owner, participants, reports, generation)  # after: reducers go on
    return messages


def _fold_late(services: Services, config: RunConfig, iteration: int, generation: int) -> list[Participant]:
    """Bounded staleness: the late updates of the last ``staleness`` iterations that no reduce took yet,
    claimed for this one."""
    if not config.training.staleness:
        return []
    table = services.table
    candidates = table.late_reports(config.run_id, iteration, config.training.staleness, generation)
    return [late for late in candidates if table.fold(config.run_id, late, iteration)]


def _late(log: dict[str, object]) -> None:
    """A worker's report came after the reduce fired without it: it is recorded and left out."""
    logger.info("late worker ignored", extra=log)
    metrics.emit(Metric.LATE_WORKERS, 1)


def publish_reduce(
    services: Services,
    config: RunConfig,
    iteration: int,
    participants: list[Participant],
    generation: int,
    shards: list[int] | None = None,
    attempt: int = 0,
    nonfinite: list[int] | None = None,
) -> list[ReduceMessage]:
    """One Reduce message per shard (all, or ``shards``); reducers are idempotent, so publishing again is safe."""
    messages = [
        ReduceMessage(
            run_id=config.run_id,
            iteration=iteration,
            generation=generation,
            shard=r,
            participants=tuple(participants),
            attempt=attempt,
        )
        for r in (range(config.reducers) if shards is None else shards)
    ]
    services.bus.publish(wiring.REDUCE, messages)
    logger.info(
        "reduce fired",
        extra={
            "run_id": config.run_id,
            "iteration": iteration,
            "participants": len(participants),
            "nonfinite": nonfinite or [],
            "shards": len(messages),
            "attempt": attempt,
        },
    )
    return messages
