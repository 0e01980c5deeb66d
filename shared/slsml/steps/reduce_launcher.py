"""ReduceLauncher: count finished workers; at the quorum, fire the reducers exactly once. Workers whose
update is non-finite count as arrived but are left out; if all of them are, the run fails."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from slsml import wiring
from slsml.barrier import quorum_count
from slsml.messages import Participant, ReduceMessage, WorkDone
from slsml.services import Services
from slsml.steps.common import run_config

logger = Logger(child=True)


def on_work_done(done: WorkDone, services: Services) -> list[ReduceMessage]:
    """Record ``done``; return the reduce messages published (none unless this message fires the barrier)."""
    config = run_config(services.store, done.run_id)
    record = services.table.record_worker(done, (done.bytes_read, done.bytes_written))
    if record.reduce_fired_by is not None and record.reduce_fired_by != done.worker:
        if done.worker in record.late and done.worker not in record.nonfinite:
            logger.info("late worker ignored", extra={"run_id": done.run_id, "iteration": done.iteration,
                                                      "worker": done.worker})
        return []
    if record.reduce_fired_by is None:
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
        participants = [
            Participant(worker=w, attempt=record.reports[w].attempt, samples=record.reports[w].samples)
            for w in finite
        ]
        if not services.table.fire_reduce(done.run_id, done.iteration, done.worker, participants):
            return []  # another worker's message fired it first
    else:  # this worker fired before and its message came again: publish again (reducers are idempotent)
        participants = record.participants
    messages = [
        ReduceMessage(run_id=done.run_id, iteration=done.iteration, shard=r, participants=tuple(participants))
        for r in range(config.reducers)
    ]
    services.bus.publish(wiring.REDUCE, messages)
    logger.info("reduce fired", extra={"run_id": done.run_id, "iteration": done.iteration,
                                       "participants": len(participants), "nonfinite": sorted(record.nonfinite)})
    return messages
