"""ReduceLauncher: count finished workers; at the quorum, fire the reducers exactly once. Workers whose update is
non-finite count as arrived but are left out; if all of them are, the run fails. Reports of an attempt the watchdog
superseded are ignored.

Fully asynchronous training (ASP, ``staleness unbounded``) has no barrier: a report's update waits in the run's table
(``RunTable.wait``) and the reduce of the model version the run is at fires with every update waiting, once
(``apply_next``); the version's merge launches their workers again and applies the updates that came meanwhile.

Under ``stale_weights`` a reduce, as it fires, launches the next iteration's workers (``launch_ahead``: those whose
invocations did not go on to it, ``steps.worker.going_on``), which train from the weights one round stale; their
reduce fires once the model it steps is merged: at the quorum if the run advanced to it by then, else by the Merger
that advances it (``fire_held``).

A round a reducer re-launched, once, because the update its worker reported was refused (``reducer``) reports again:
its fresh update takes the refused one's place among the reduce's participants, and the reduce fires again
(``refire``)."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from slsml.pipeline import metrics
from slsml.pipeline.services import Services
from slsml.pipeline.steps import work_launcher
from slsml.pipeline.steps.common import run_config
from slsml.pipeline.steps.warm import reader_for
from slsml.rounds.evaluation import evaluated
from slsml.spec import wiring
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.messages import Participant, ReduceMessage, WorkDone
from slsml.state.barrier import quorum_count
from slsml.state.records import DEADLINE_OWNER, RunRecord, RunStatus

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
    if config.training.asynchronous:
        if not done.finite:
            reason = (
                f"worker {done.worker}'s update on model version {done.iteration} is not finite: staleness unbounded"
                " applies every update; lower the learning rate, or train synchronously"
            )
            logger.error("run failed", extra={**log, "reason": reason})
            services.fail_run(done.run_id, reason)
            return []
        services.table.wait(done)
        return apply_next(services, config, done.generation, done.worker)
    if counter.reduce_fired_by is not None and done.worker in counter.redone:
        return refire(services, config, done)
    if counter.reduce_fired_by == done.worker:  # a copy of the report that fired: its reduce went out then
        logger.info("duplicate of the firing report ignored", extra=log)
        return []
    if counter.reduce_fired_by is not None:
        _late(log)
        return []
    finite, workers = counter.arrived - counter.nonfinite_arrived, counter.workers or config.workers
    if finite < quorum_count(workers, config.training.quorum) and counter.arrived < workers:
        return []
    if config.training.stale_weights and services.table.get_run(done.run_id).iteration < done.iteration:
        logger.info("reduce held: the model it steps is not merged yet", extra=log)
        return []  # the Merger that merges it fires it
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
    if config.training.stale_weights:
        launch_ahead(services, config, iteration + 1, generation)
    return messages


def refire(services: Services, config: RunConfig, done: WorkDone) -> list[ReduceMessage]:
    """``done`` reports the update of a round re-launched after its first update was refused: fire the reduce again,
    with it in the refused one's place (once: a duplicate of the report finds it there)."""
    log = {"run_id": done.run_id, "iteration": done.iteration, "worker": done.worker, "attempt": done.attempt}
    redone = Participant(worker=done.worker, attempt=done.attempt, samples=done.samples, etag=done.etag)
    participants = services.table.redo_participant(done.run_id, done.iteration, done.generation, redone)
    if participants is None:
        logger.info("duplicate of a re-launched round's report ignored", extra=log)
        return []
    logger.warning("reduce fired again: a re-launched round's update replaces the refused one", extra=log)
    return publish_reduce(services, config, done.iteration, participants, done.generation)


def apply_next(
    services: Services, config: RunConfig, generation: int, owner: int, run: RunRecord | None = None
) -> list[ReduceMessage]:
    """ASP: fire the reduce of the model version the run is at with every update waiting, unless one fired already
    ([] then, or when none waits): each is claimed for the version (``fold``), and the version's participants are
    written once, by ``owner`` (the worker whose report calls, or the Merger, or the watchdog), so that an update is
    applied once however often its report comes, and only the owner's step (or its retry) publishes the reduce. An
    update's staleness is the updates applied since the version it read: its participant names that version
    (``Participant.iteration``) where it is older. ``run``: the run as its caller just wrote it (the Merger's
    advance), else read."""
    table, run_id = services.table, config.run_id
    run = run or table.get_run(run_id)
    version = run.iteration
    if run.status != RunStatus.RUNNING or run.generation != generation or version >= run.iterations:
        return []
    frozen = table.frozen_participants(run_id, version)
    if frozen is not None and frozen[0] != owner:
        if owner != DEADLINE_OWNER or table.get_counter(run_id, version).reduce_fired_by is not None:
            return []  # its merge applies the updates waiting (after its advance, which comes after this read)
        # a deadline passed, the version's updates frozen and its reduce never sent (the step that froze them ended
        # before, and no retry of it came): the watchdog sends it in that step's place
        owner = frozen[0]
    claimed = []
    for update in table.waiting(run_id, config.workers, generation):
        if table.fold(run_id, update, version):
            claimed.append(update)
        elif _applied(services, run_id, update):  # a duplicate report waited again: its entry goes
            table.applied(run_id, update)
        # else claimed by a step that fired nothing with it: it gives it back and looks again
    if not claimed:
        return []
    mine = [u.model_copy(update={"iteration": None}) if u.iteration == version else u for u in claimed]
    fired = table.freeze_participants(run_id, version, owner, mine, generation)
    taken = set() if fired is None else set(fired[1])
    for update, participant in zip(claimed, mine, strict=True):
        if participant not in taken:  # the version applies other updates: this one waits for the next
            table.unfold(run_id, update, version)
    if fired is None or fired[0] != owner:  # another step fired the version
        # a merge that came meanwhile found the updates claimed and left them: they go to the newest version
        return apply_next(services, config, generation, owner) if table.get_run(run_id).iteration != version else []
    participants = fired[1]
    table.open_version(run_id, version, generation)  # before the reducers report to it
    messages = publish_reduce(services, config, version, participants, generation)
    fresh = any(p.iteration is None for p in participants)  # train metrics are of the updates of this version's model
    reports = table.worker_reports(run_id, version, config.workers, generation) if fresh else []
    table.mark_reduce_fired(run_id, version, owner, participants, reports, generation)
    for update, participant in zip(claimed, mine, strict=True):
        if participant in taken:
            table.applied(run_id, update)
    return messages


def _applied(services: Services, run_id: str, update: Participant) -> bool:
    """ASP: whether ``update`` is a participant of the version its record says it was claimed for."""
    assert update.iteration is not None  # a waiting update names the version it read
    report = services.table.get_iteration(run_id, update.iteration).reports.get(update.worker)
    if report is None or report.folded_into is None:
        return False
    into = report.folded_into
    frozen = services.table.frozen_participants(run_id, into)
    return frozen is not None and any(
        (p.worker, p.attempt, into if p.iteration is None else p.iteration)
        == (update.worker, update.attempt, update.iteration)
        for p in frozen[1]
    )


def launch_ahead(services: Services, config: RunConfig, iteration: int, generation: int) -> None:
    """``stale_weights``: launch ``iteration``'s workers before the model entering it is merged, unless the Merger
    launches them (the iteration evaluates that model first, or is the final evaluation)."""
    count = reader_for(services.store, config).manifest.train.count
    if iteration >= config.training.iterations or evaluated(config, iteration, count):
        return
    run = services.table.get_run(config.run_id)
    if run.generation == generation:
        work_launcher.launch(run, iteration, f"ahead-{iteration}#{generation}", services, ahead=True)


def fire_held(services: Services, config: RunConfig, iteration: int, generation: int) -> None:
    """``stale_weights``: the model entering ``iteration`` is merged: fire the iteration's reduce if its quorum came
    before (its reports held it)."""
    counter = services.table.get_counter(config.run_id, iteration)
    if (counter.launched_by is None and not counter.went_on) or counter.reduce_fired_by is not None:
        return  # (workers that went on to it from the round before may report before its launch)
    workers = counter.workers or config.workers
    reports = services.table.worker_reports(config.run_id, iteration, workers, generation)
    if reports:
        fire_reduce(services, config, iteration, workers, generation, reports[0].worker, config.training.quorum)


def _fold_late(services: Services, config: RunConfig, iteration: int, generation: int) -> list[Participant]:
    """Bounded staleness: the late updates of the last ``staleness`` iterations that no reduce took yet,
    claimed for this one."""
    if not config.training.staleness_bound:
        return []
    table = services.table
    candidates = table.late_reports(config.run_id, iteration, config.training.staleness_bound, generation)
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
