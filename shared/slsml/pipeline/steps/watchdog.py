"""Watchdog: an iteration's deadline came and the iteration is not merged yet.

One deadline of a run is pending at a time: the first launch of a run (or of a resumed generation)
sends one, and each deadline, when it comes, sends the next one, for the iteration the run is at then.
A fast run thus costs one watchdog invocation per deadline period, not one per iteration.

Work stage (the reduce has not fired): while a missing worker's round goes on in a fresh invocation that is
not past its time (``slsml.training.progress``), wait for it; else if at least the floor of workers is in, fire
the reduce with them; otherwise re-launch the missing workers with a new attempt number (reports of the old
attempt are ignored from then on), and once the retry budget is spent, fail the run with a reason
naming the stage. An iteration whose launch has not come (its model's event is late or lost) is
launched by the watchdog: it claims the launch, with the run's current workers, and re-launches them
all (or stops the run whose spend reached its dollar budget, as the launch would have); past the run's
iterations it completes the run instead, once the final model is stored. Under ASP (``staleness unbounded``)
the work stage has no missing workers: a version no update reached applies those that wait, or re-launches the
workers whose last launch has not reported, and fails the run after ``deadline_retries`` more deadlines. Reduce
stage: re-launch the reducers whose shards are missing; once the retry budget is spent, those shards keep the
iteration's weights (counted and logged) and the merge goes on, unless the reduce waits for the round a reducer
re-launched because the update its worker reported was refused: the run fails then, naming the update.

With a GPU worker (``slsml.aws.fleet``), an iteration whose launch has not come waits for the worker's fleet (the
first launch of a run leaves it here while the fleet is raised): the watchdog looks again every
``work_launcher.FLEET_POLL_S`` and launches it as its model's event would have, once the fleet is there. Each
deadline of a running run sizes the fleet again (a resize another run's start or end made from a stale read is
undone), and the deadline that finds the run ended lowers it.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum

from aws_lambda_powertools import Logger

from slsml.aws import fleet as gpu_fleet
from slsml.pipeline import metrics, spend
from slsml.pipeline.services import Services
from slsml.pipeline.steps import work_launcher
from slsml.pipeline.steps.common import changed_behind, complete_run, run_config, size_fleet, stop_reason
from slsml.pipeline.steps.reduce_launcher import apply_next, fire_reduce, publish_reduce
from slsml.pipeline.steps.reducer import keep_weights
from slsml.spec import keys, wiring
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.errors import NotFoundError
from slsml.spec.messages import Deadline, ReduceDone, WorkMessage
from slsml.state import barrier
from slsml.state.barrier import quorum_count
from slsml.state.records import (
    DEADLINE_LAUNCH,
    DEADLINE_OWNER,
    IterationRecord,
    PendingDeadline,
    RunRecord,
    RunStatus,
)

logger = Logger(child=True)


class Action(StrEnum):
    NOTHING = "nothing"  # the stage is done, or the run moved on
    NOT_DUE = "not-due"  # delivered early (SQS delays at most 15 minutes): sent on again
    WATCHING_REDUCE = "watching-reduce"
    FIRED = "fired"
    RELAUNCHED = "relaunched"
    STALE_SHARDS = "stale-shards"
    FAILED = "failed"
    COMPLETED = "completed"  # the final model's event is late or lost: the run is completed, nothing launched
    STOPPED = "stopped"  # an iteration it would launch: the run's spend reached its budget
    CONTINUING = "continuing"  # missing workers' rounds go on in fresh invocations, in time: waited for
    AWAITING_FLEET = "awaiting-fleet"  # a launch waits for the GPU worker's fleet
    LAUNCHED = "launched"  # the GPU worker's fleet came: the iteration was launched


# what DeadlineActions counts
ACTED = {Action.FIRED, Action.RELAUNCHED, Action.STALE_SHARDS, Action.FAILED, Action.COMPLETED, Action.STOPPED}


def on_deadline(deadline: Deadline, services: Services) -> Action:
    """Act on the run's current iteration; unless the run ended, send the chain's next deadline. What a deadline of
    the chain is (its iteration, stage, round and when it is due) is read from the run's record, where the watchdog
    that sent it recorded it (``RunRecord.pending``): the message names only its run, generation and place in the
    chain. The chain moves on (``RunRecord.watched``) only once the next deadline is sent, so a try that failed
    midway is carried on by its redelivery, and a duplicate that comes later finds the chain moved."""
    try:
        run = services.table.get_run(deadline.run_id)
    except NotFoundError:
        return Action.NOTHING
    if deadline.stage == "end":
        return _end(deadline, run, services)
    if run.status != RunStatus.RUNNING or run.generation != deadline.generation or run.watched != deadline.link:
        if run.status != RunStatus.RUNNING and run.generation == deadline.generation and run.watched == deadline.link:
            size_fleet(services, run)  # the chain ends with the run: its GPU workers go (raises: redelivered)
        return Action.NOTHING  # the run ended, or another copy of this deadline carried the chain on
    if run.pending is not None:
        deadline = deadline.model_copy(update=run.pending.model_dump())
    if deadline.due_at > time.time() + 1:  # delivered early (SQS delays at most 15 minutes): sent on
        services.deadlines.schedule(deadline.model_copy(update={"resent": deadline.resent + 1}))
        return Action.NOT_DUE
    action, following = _act(deadline.model_copy(update={"link": deadline.link + 1, "resent": 0}), run, services)
    if following is not None:
        services.deadlines.schedule(following)
    if action in ACTED:
        metrics.emit(Metric.DEADLINE_ACTIONS, 1)
    if action != Action.AWAITING_FLEET and gpu_fleet.from_env() is not None:  # (a launch waiting sized it)
        size_fleet(services, services.table.get_run(run.run_id), quiet=True)
    services.table.watch(run.run_id, deadline.link, deadline.link + 1, pending(following))
    return action


def pending(deadline: Deadline | None) -> PendingDeadline | None:
    """What the run records of the chain's deadline ``deadline``, which the watchdog acts on when it comes."""
    return None if deadline is None else PendingDeadline.model_validate(deadline.model_dump())


def _end(deadline: Deadline, run: RunRecord, services: Services) -> Action:
    """A step that may not answer the run's execution asked: end it as the run's record says (failed or stopped),
    or complete the run if its final evaluation is in, or if early stopping ends it after the evaluation of the model
    entering the deadline's iteration. Beside the chain of deadlines, which it does not move."""
    if run.generation != deadline.generation:
        return Action.NOTHING
    if run.status == RunStatus.FAILED:
        services.orchestrator.fail(run.task_token, run.reason or "the run failed")
        size_fleet(services, run, quiet=True)
    elif run.status == RunStatus.STOPPED:
        services.orchestrator.stop(run.task_token, run.reason or "the run was stopped")
        size_fleet(services, run, quiet=True)
    elif run.status == RunStatus.RUNNING:
        if deadline.iteration >= run.iterations:
            if services.table.get_counter(run.run_id, deadline.iteration - 1).test is None:
                return Action.NOTHING
            complete_run(services, run.run_id, deadline.iteration)
            return Action.COMPLETED
        config = run_config(services, run.run_id)
        if (reason := stop_reason(config, services.table)) is not None:
            complete_run(services, run.run_id, deadline.iteration, reason)
            return Action.COMPLETED
    return Action.NOTHING


Acted = tuple[Action, Deadline | None]  # what the watchdog did, and the chain's next deadline (None: the chain ends)


def _act(deadline: Deadline, run: RunRecord, services: Services) -> Acted:
    if reason := changed_behind(run, run_config(services, run.run_id)):
        logger.error("run failed", extra={"run_id": run.run_id, "reason": reason})
        services.fail_run(run.run_id, reason)
        return Action.FAILED, None
    if run.iteration != deadline.iteration:  # the run moved on: watch the iteration it is at
        deadline = _next(deadline, "work", 0, (run.iteration_at or deadline.due_at) + run.deadline_s)
        deadline = deadline.model_copy(update={"iteration": run.iteration})
        if deadline.due_at > time.time():
            return Action.NOTHING, deadline
    if deadline.iteration >= run.iterations:  # the budget is spent: evaluate the final model once it is in
        if not services.store.exists(keys.model(run.run_id, deadline.iteration)):
            return Action.NOTHING, _next(deadline, "work", 0, _after(deadline, run.deadline_s))
        if services.table.get_counter(run.run_id, deadline.iteration - 1).test is not None:
            complete_run(services, run.run_id, deadline.iteration)  # evaluated: its last worker's finish was lost
            return Action.COMPLETED, None
        # else its evaluation round is a work stage like any other: its workers are launched or re-launched
    config = run_config(services, deadline.run_id)
    record = services.table.get_iteration(deadline.run_id, deadline.iteration)
    if deadline.stage == "work":
        if record.launched_by is None and deadline.iteration < run.iterations and gpu_fleet.from_env() is not None:
            return _launch_on_fleet(deadline, run, services)
        if record.launched_by is None and config.training.asynchronous and deadline.iteration < run.iterations:
            work_launcher.launch(run, deadline.iteration, DEADLINE_LAUNCH, services)  # the freed worker, as its merge's
            record = services.table.get_iteration(deadline.run_id, deadline.iteration)
        if record.launched_by is None:  # its model's launch is late or lost: the workers re-launched now launch it
            spent = spend.spent(services, run)
            if reason := spend.exhausted(run, spent):  # as the launch would have
                services.stop_run(run.run_id, reason)
                return Action.STOPPED, None
            record = _claim_launch(deadline, run, record, services, spent)
        return _work_deadline(deadline, config, record, services)
    return _reduce_deadline(deadline, config, record, services)


def _launch_on_fleet(deadline: Deadline, run: RunRecord, services: Services) -> Acted:
    """The launch of the deadline's iteration has not come (a run's first waits for its GPU fleet): launch it as its
    model's event would have once the fleet holds the running runs' workers; until then, look again."""
    if not size_fleet(services, run, quiet=True):
        return Action.AWAITING_FLEET, _next(deadline, "work", deadline.round, time.time() + work_launcher.FLEET_POLL_S)
    outcome = work_launcher.launch(run, deadline.iteration, DEADLINE_LAUNCH, services)
    logger.info(
        "GPU fleet ready: iteration launched",
        extra={"run_id": run.run_id, "iteration": deadline.iteration, "outcome": outcome},
    )
    return Action.LAUNCHED, _next(deadline, "work", 0, time.time() + run.deadline_s)


def _claim_launch(
    deadline: Deadline, run: RunRecord, record: IterationRecord, services: Services, spent: float | None
) -> IterationRecord:
    """Claim the launch of the deadline's iteration with the run's current workers (and the spend it saw), so
    that the late launch finds it taken and publishes nothing, and the iteration's times start here."""
    counter = services.table.claim_launch(
        run.run_id, deadline.iteration, DEADLINE_LAUNCH, deadline.generation, run.workers, run.workers_reason, spent
    )
    if counter is None:  # the launch came meanwhile
        return services.table.get_iteration(run.run_id, deadline.iteration)
    return record.model_copy(update=counter.model_dump(include={"launched_by", "launched_at", "workers"}))


def _after(deadline: Deadline, seconds: float) -> float:
    """When the next deadline is due: ``seconds`` after this one was due, so that two copies of it handled at
    once send identical next deadlines (which the watchdog's idempotency takes once); ``seconds`` from now
    if this one came late by half of that or more."""
    now = time.time()
    return (deadline.due_at if now - deadline.due_at < seconds / 2 else math.ceil(now)) + seconds


def _next(deadline: Deadline, stage: str, round_: int, due_at: float) -> Deadline:
    return deadline.model_copy(update={"stage": stage, "round": round_, "due_at": due_at, "resent": 0})


def _work_deadline(deadline: Deadline, config: RunConfig, record: IterationRecord, services: Services) -> Acted:
    spec, run_id, iteration = config.training, config.run_id, deadline.iteration
    if record.reduce_fired_by is not None:  # the workers made it: watch the reducers from when they started
        return Action.WATCHING_REDUCE, _next(deadline, "reduce", 0, (record.reduce_fired_at or 0) + spec.deadline_s)
    if spec.asynchronous and iteration < spec.iterations:
        return _asynchronous_deadline(deadline, config, services)
    finite, workers = sorted(record.done - record.nonfinite), record.workers or config.workers
    floor = min(quorum_count(workers, spec.deadline_floor), quorum_count(workers, spec.quorum))
    missing = [w for w in range(workers) if w not in record.done]
    log = {"run_id": run_id, "iteration": iteration, "round": deadline.round, "missing": missing}
    now = time.time()
    if continuing := [w for w in missing if record.continuing.get(w, 0.0) > now]:
        # a round handed on to a fresh invocation in time is no straggler: the stage waits for it
        logger.info("deadline: rounds go on in fresh invocations", extra={**log, "continuing": continuing})
        return Action.CONTINUING, _next(deadline, "work", deadline.round, _after(deadline, spec.deadline_s))
    if finite and len(finite) >= floor:
        fire_reduce(services, config, iteration, workers, deadline.generation, DEADLINE_OWNER, spec.deadline_floor)
        logger.warning("deadline: reduce fired without the missing workers", extra=log)
        return Action.FIRED, _next(deadline, "reduce", 0, _after(deadline, spec.deadline_s))
    if deadline.round < spec.deadline_retries:
        attempt = deadline.round + 1
        services.table.relaunch_workers(run_id, iteration, deadline.generation, dict.fromkeys(missing, attempt))
        services.bus.publish(
            wiring.WORK,
            [
                staged
                for w in missing
                for staged in WorkMessage(
                    run_id=run_id,
                    iteration=iteration,
                    generation=deadline.generation,
                    worker=w,
                    workers=workers,
                    attempt=attempt,
                ).staged(spec.pipeline_stages)
            ],
        )
        logger.warning("deadline: missing workers re-launched", extra={**log, "attempt": attempt})
        return Action.RELAUNCHED, _next(deadline, "work", attempt, _after(deadline, spec.deadline_s))
    if iteration >= spec.iterations:  # the final evaluation needs every slice: a straggler is waited for, not failed
        logger.warning("deadline: the final evaluation waits for its missing workers", extra=log)
        return Action.NOTHING, _next(deadline, "work", deadline.round, _after(deadline, spec.deadline_s))
    reason = (
        f"work stage of iteration {iteration}: {len(finite)} of {workers} workers delivered an update"
        f" within {spec.deadline_retries + 1} deadlines of {spec.deadline_s:g} s, fewer than the floor of"
        f" {floor}; workers {missing} were re-launched {spec.deadline_retries} times"
    )
    logger.error("run failed", extra={**log, "reason": reason})
    services.fail_run(run_id, reason)
    return Action.FAILED, None


def _asynchronous_deadline(deadline: Deadline, config: RunConfig, services: Services) -> Acted:
    """ASP: no update was applied to the model version the run is at within a deadline. Apply one that waits (its
    reduce's fire was lost); else wait for the rounds handed on in time; else re-launch, with a new attempt, each
    worker whose last launch has not reported (on the version it was launched on); once ``deadline_retries``
    deadlines passed so, fail the run naming the version."""
    spec, run_id, iteration = config.training, config.run_id, deadline.iteration
    if apply_next(services, config, deadline.generation, DEADLINE_OWNER):
        logger.warning("deadline: a waiting update applied", extra={"run_id": run_id, "iteration": iteration})
        return Action.FIRED, _next(deadline, "reduce", 0, _after(deadline, spec.deadline_s))
    launches = _last_launches(services, config, iteration)
    missing = {w: launch for w, launch in launches.items() if w not in launch[0].done}
    log = {"run_id": run_id, "iteration": iteration, "round": deadline.round, "missing": sorted(missing)}
    if any(record.continuing.get(w, 0.0) > time.time() for w, (record, _) in missing.items()):
        logger.info("deadline: rounds go on in fresh invocations", extra=log)
        return Action.CONTINUING, _next(deadline, "work", deadline.round, _after(deadline, spec.deadline_s))
    if not missing and deadline.round < spec.deadline_retries:  # every last launch reported: its update is on its way
        return Action.NOTHING, _next(deadline, "work", deadline.round + 1, _after(deadline, spec.deadline_s))
    if missing and deadline.round < spec.deadline_retries:
        attempt = deadline.round + 1
        for worker, (record, _) in missing.items():
            services.table.relaunch_workers(run_id, record.iteration, deadline.generation, {worker: attempt})
        services.bus.publish(
            wiring.WORK,
            [
                WorkMessage(
                    run_id=run_id,
                    iteration=record.iteration,
                    generation=deadline.generation,
                    worker=worker,
                    workers=config.workers,
                    attempt=attempt,
                    update=update,
                )
                for worker, (record, update) in missing.items()
            ],
        )
        logger.warning("deadline: missing workers re-launched", extra={**log, "attempt": attempt})
        return Action.RELAUNCHED, _next(deadline, "work", attempt, _after(deadline, spec.deadline_s))
    reason = (
        f"model version {iteration}: no worker's update arrived within {spec.deadline_retries + 1} deadlines of"
        f" {spec.deadline_s:g} s (staleness unbounded); workers {sorted(missing)} were re-launched"
        f" {spec.deadline_retries} times"
    )
    logger.error("run failed", extra={**log, "reason": reason})
    services.fail_run(run_id, reason)
    return Action.FAILED, None


def _last_launches(services: Services, config: RunConfig, iteration: int) -> dict[int, tuple[IterationRecord, int]]:
    """ASP: worker → the record of the version it was last launched on, up to ``iteration``, and the number of the
    update it computes there (a version launches the workers whose updates made it, none whose update is past the
    run's iterations), read from ``iteration`` back, from each version to the one that made it, until every
    worker's is found."""
    workers, table, budget = config.workers, services.table, config.training.iterations
    found: dict[int, tuple[IterationRecord, int]] = {}
    finished: set[int] = set()  # freed with no update left to take
    version = iteration
    while len(found) + len(finished) < workers:
        freed = work_launcher.freed(services, config.run_id, version, workers)
        numbered = barrier.asynchronous_updates(version, freed, workers, budget)
        record = table.get_iteration(config.run_id, version)
        fresh = set(freed) - found.keys() - finished
        found.update({w: (record, numbered[w]) for w in fresh if w in numbered})
        finished |= fresh - numbered.keys()
        if not version or not freed:
            break
        version -= len(freed)  # the version that made this one
    return found


def _reduce_deadline(deadline: Deadline, config: RunConfig, record: IterationRecord, services: Services) -> Acted:
    spec, run_id, iteration = config.training, config.run_id, deadline.iteration
    updates = len(record.participants)
    following = barrier.next_version(iteration, updates, spec.asynchronous)
    missing = (
        []
        if record.merge_fired_by is not None
        else [s for s in range(config.reducers) if not services.store.exists(keys.shard(run_id, following, s))]
    )
    if not missing:  # the Merger has what it needs (its own retries cover it): look again in a while
        return Action.NOTHING, _next(deadline, "work", 0, _after(deadline, spec.deadline_s))
    log = {"run_id": run_id, "iteration": iteration, "round": deadline.round, "shards": missing}
    if deadline.round < spec.deadline_retries:
        attempt = deadline.round + 1
        publish_reduce(services, config, iteration, record.participants, deadline.generation, missing, attempt)
        services.table.record_reduce_relaunch(run_id, iteration, len(missing))
        logger.warning("deadline: missing reducers re-launched", extra={**log, "attempt": attempt})
        return Action.RELAUNCHED, _next(deadline, "reduce", attempt, _after(deadline, spec.deadline_s))
    if refused := [
        p for p in record.participants if p.worker in record.redone and p.attempt < record.relaunched.get(p.worker, 0)
    ]:
        key = keys.update(run_id, iteration, refused[0].worker, refused[0].attempt)
        reason = (
            f"{key} was refused and the round of worker {refused[0].worker}, re-launched for it, reported no update"
            f" within {spec.deadline_retries + 1} deadlines of {spec.deadline_s:g} s"
        )
        logger.error("run failed", extra={**log, "reason": reason})
        services.fail_run(run_id, reason)
        return Action.FAILED, None
    for shard in missing:
        keep_weights(services, config, iteration, shard, following)
    services.bus.publish(
        wiring.REDUCE_DONE,
        [
            ReduceDone(run_id=run_id, iteration=iteration, generation=deadline.generation, shard=s, updates=updates)
            for s in missing
        ],
    )
    logger.warning("deadline: shards keep their weights for this iteration", extra=log)
    return Action.STALE_SHARDS, _next(deadline, "work", 0, _after(deadline, spec.deadline_s))
