"""ReduceLauncher: count finished workers; at the quorum, fire the reducers exactly once. Workers whose
update is non-finite count as arrived but are left out; if all of them are, the run fails. Reports
of an attempt the watchdog superseded are ignored."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from slsml import wiring
from slsml.barrier import quorum_count
from slsml.config import RunConfig
from slsml.messages import Participant, ReduceMessage, WorkDone
from slsml.runstate import IterationRecord
from slsml.services import Services
from slsml.steps.common import run_config

logger = Logger(child=True)


def on_work_done(done: WorkDone, services: Services) -> list[ReduceMessage]:
    """Record ``done``; return the reduce messages published (none unless this message fires the barrier)."""
    config = run_config(services.store, done.run_id)
    record = services.table.record_worker(done, (done.bytes_read, done.bytes_written))
    if record is None:
        logger.info("stale attempt ignored", extra={"run_id": done.run_id, "iteration": done.iteration,
                                                    "worker": done.worker, "attempt": done.attempt})
        return []
    if record.reduce_fired_by is not None and record.reduce_fired_by != done.worker:
        if done.worker in record.late and done.worker not in record.nonfinite:
            logger.info("late worker ignored", extra={"run_id": done.run_id, "iteration": done.iteration,
                                                      "worker": done.worker})
        return []
    if record.reduce_fired_by is not None:  # this worker fired before and its message came again
        return publish_reduce(services, config, record, record.participants, done.generation)
    finite = sorted(record.done - record.nonfinite)
    everyone_in = len(record.done) >= config.workers
    if not finite:
        if everyone_in:
            reason = f"all {config.workers} workers produced non-finite updates at iteration {done.iteration}"
            logger.error("run failed", extra={"run_id": done.run_id, "reason": reason})
            services.fail_run(done.run_id, reason)
        return []
    # non-finite updates are left out; once every worker is in there is nothing left to wait for
    if len(finite) < quorum_count(config.workers, config.training.quorum) and not everyone_in:
        return []
    return fire_reduce(services, config, record, done.worker, done.generation)


def fire_reduce(
    services: Services, config: RunConfig, record: IterationRecord, owner: int, generation: int
) -> list[ReduceMessage]:
    """Fire the reduce of ``record`` with its finite reports, once: [] if someone else fired it."""
    participants = [
        Participant(worker=w, attempt=record.reports[w].attempt, samples=record.reports[w].samples)
        for w in sorted(record.done - record.nonfinite)
    ]
    if not services.table.fire_reduce(config.run_id, record.iteration, owner, participants):
        return []  # another worker's message (or the watchdog) fired it first
    return publish_reduce(services, config, record, participants, generation)


def publish_reduce(
    services: Services,
    config: RunConfig,
    record: IterationRecord,
    participants: list[Participant],
    generation: int,
    shards: list[int] | None = None,
    attempt: int = 0,
) -> list[ReduceMessage]:
    """One Reduce message per shard (all, or ``shards``); reducers are idempotent, so publishing again is safe."""
    messages = [
        ReduceMessage(run_id=config.run_id, iteration=record.iteration, generation=generation, shard=r,
                      participants=tuple(participants), attempt=attempt)
        for r in (range(config.reducers) if shards is None else shards)
    ]
    services.bus.publish(wiring.REDUCE, messages)
    logger.info("reduce fired", extra={"run_id": config.run_id, "iteration": record.iteration,
                                       "participants": len(participants), "nonfinite": sorted(record.nonfinite),
                                       "shards": len(messages), "attempt": attempt})
    return messages
