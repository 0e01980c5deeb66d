"""ReduceLauncher: count finished workers; at the quorum, fire the reducers exactly once."""

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
        if done.worker in record.late:
            logger.info("late worker ignored", extra={"run_id": done.run_id, "iteration": done.iteration,
                                                      "worker": done.worker})
        return []
    if record.reduce_fired_by is None:
        if len(record.done) < quorum_count(config.workers, config.training.quorum):
            return []
        participants = [
            Participant(worker=w, attempt=record.reports[w].attempt, samples=record.reports[w].samples)
            for w in sorted(record.done)
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
                                       "participants": len(participants)})
    return messages
