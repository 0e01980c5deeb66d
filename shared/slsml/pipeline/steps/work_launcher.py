"""WorkLauncher: an iteration's trigger is stored (the initial model, whose S3 event says so, or the manifest of the
model entering a later one, which the Merger announces: ``keys.trigger``) → launch its iteration's workers; the final
model's: launch the workers that evaluate it (an iteration past the budget: see ``steps.worker``), which finish the
run. Under ``stale_weights`` a reduce that fires launches the next iteration ahead of its model: Work goes to the
workers whose invocations did not go on to it from the round before (``steps.worker``). Under ASP (``staleness
unbounded``) a model version launches only the workers whose updates made it (the first: all of them), each with the
number of the update it computes. A run whose spend reached its dollar budget launches nothing more: it is stopped
(``slsml.pipeline.spend``). With a GPU worker, a run's first launch raises the worker's fleet (``slsml.aws.fleet``)
and, until it is there, leaves the launch to the watchdog, which looks again every FLEET_POLL_S and launches once it
is."""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum

from aws_lambda_powertools import Logger

from slsml.pipeline import spend, tuner
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import changed_behind, complete_run, outcome, run_config, size_fleet
from slsml.spec import keys, wiring
from slsml.spec.errors import NotFoundError
from slsml.spec.messages import Deadline, ModelLanded, ModelMerged, RunStarted, WorkMessage
from slsml.state import barrier
from slsml.state.records import PendingDeadline, RunRecord, RunStatus, iteration_sk

logger = Logger(child=True)


class Outcome(StrEnum):
    IGNORED = "ignored"
    LAUNCHED = "launched"
    ALREADY_LAUNCHED = "already-launched"
    COMPLETED = "completed"
    STOPPED = "stopped"  # its spend reached its budget
    REFUSED = "refused"  # the run asks beyond the deployment's limits: it is FAILED with the reason
    AWAITING_FLEET = "awaiting-fleet"  # a GPU worker's fleet is raised for the run: the watchdog launches it once there


# how often the watchdog looks whether the GPU fleet a run waits for is there (Lambda adds instances and execution
# environments in minutes)
FLEET_POLL_S = 30


def on_model(landed: ModelLanded, services: Services) -> Outcome:
    """Launch the first iteration of the run whose initial model landed."""
    key = landed.key
    parsed = keys.parse_model_key(key)
    if parsed is None:
        logger.info("object is not a pipeline model: ignored", extra={"key": key})
        return Outcome.IGNORED
    run_id, iteration = parsed
    if iteration:  # a manifest: the Merger that stored it announces it (ModelMerged), no S3 event
        logger.info("a manifest's S3 event launches nothing: ignored", extra={"key": key, "run_id": run_id})
        return Outcome.IGNORED
    try:
        run = services.table.get_run(run_id)
    except NotFoundError:
        logger.error("model belongs to no known run: ignored", extra={"key": key, "run_id": run_id})
        return Outcome.IGNORED
    return _launch(run, iteration, f"{key}@{landed.sequencer}", services)


def on_merged(merged: ModelMerged, services: Services) -> Outcome:
    """Launch the iteration whose manifest the Merger stored, if its run is still in the generation that merged it."""
    run = services.table.get_run(merged.run_id)
    if merged.generation != run.generation:
        logger.info(
            "model merged by another generation of its run: ignored",
            extra={"run_id": run.run_id, "generation": merged.generation, "current": run.generation},
        )
        return Outcome.IGNORED
    trigger = f"{keys.manifest(run.run_id, merged.iteration)}#{merged.generation}"
    return _launch(run, merged.iteration, trigger, services)


def _launch(run: RunRecord, iteration: int, trigger_id: str, services: Services, ahead: bool = False) -> Outcome:
    """Launch the workers of ``iteration`` (once per trigger) and schedule its deadline, or finish the run, or
    fail it if it asks beyond the deployment's limits (whatever started it: the CLI, the API, a dropped model).
    ``ahead``: the iteration after the run's, whose model is not merged yet (``stale_weights``)."""
    run_id = run.run_id
    if run.status != RunStatus.RUNNING:
        logger.info("run is not running: ignored", extra={"run_id": run_id, "status": run.status})
        return Outcome.IGNORED
    behind = run.training.asynchronous and iteration < run.iteration  # ASP moves on without waiting for a launch
    if iteration != run.iteration + ahead and not behind:  # e.g. the initial model placed again when a run is resumed
        logger.info(
            "model is not the run's current one: ignored",
            extra={"run_id": run_id, "iteration": iteration, "current": run.iteration},
        )
        return Outcome.IGNORED
    if reason := changed_behind(run, run_config(services, run_id)):
        logger.error("run failed", extra={"run_id": run_id, "iteration": iteration, "reason": reason})
        services.fail_run(run_id, reason)
        return Outcome.REFUSED
    if iteration >= run.iterations and services.table.get_counter(run_id, iteration - 1).test is not None:
        complete_run(services, run_id, iteration)  # its evaluation is in: a resumed run that had finished
        return Outcome.COMPLETED
    spent = spend.spent(services, run)
    if reason := spend.exhausted(run, spent):
        services.stop_run(run_id, reason)
        logger.warning(
            "run stopped: its budget is spent", extra={"run_id": run_id, "iteration": iteration, "reason": reason}
        )
        return Outcome.STOPPED
    if run.training.workers == "auto" and 0 < iteration < run.iterations:
        run = _tune(run, iteration, services)
    refusal = services.limits.refusal(run.training, run.workers)
    if refusal is not None:
        logger.error("run refused", extra={"run_id": run_id, "iteration": iteration, "reason": refusal})
        services.fail_run(run_id, refusal)
        return Outcome.REFUSED
    if run.watched is None and iteration < run.iterations and not size_fleet(services, run, quiet=True):
        return _await_fleet(run, iteration, services)  # a GPU worker's fleet is raised: the watchdog launches
    counter = services.table.claim_launch(
        run_id, iteration, trigger_id, run.generation, run.workers, run.workers_reason, spent
    )
    if counter is None:
        return _skipped(run, iteration, trigger_id, services)
    workers = counter.workers or run.workers
    if iteration >= run.iterations and run.task_token:  # the evaluation round: a heartbeat window of its own
        services.orchestrator.heartbeat(run.task_token)
        services.table.mark_heartbeat(run_id)
    asynchronous = run.training.asynchronous and iteration < run.iterations
    launched: Mapping[int, int | None]
    if asynchronous:
        launched = asynchronous_launches(services, run.run_id, iteration, workers, run.iterations)
    elif ahead:  # the workers whose invocations went on to the iteration from the one before compute it there
        launched = dict.fromkeys(services.table.send_work(run_id, iteration, workers))
    else:
        launched = dict.fromkeys(range(workers))
    services.bus.publish(
        wiring.WORK,
        [
            staged
            for w, update in launched.items()
            for staged in WorkMessage(
                run_id=run_id,
                iteration=iteration,
                generation=run.generation,
                worker=w,
                workers=workers,
                ahead=ahead,
                update=update,
            ).staged(run.training.pipeline_stages)
        ],
    )
    if run.watched is None:  # the first launch of this generation starts its chain of deadlines
        _start_chain(services, run, iteration, time.time() + run.deadline_s)
    logger.info(
        "evaluation launched" if iteration >= run.iterations else "iteration launched",
        extra={"run_id": run_id, "iteration": iteration, "workers": workers, "sent": len(launched)},
    )
    return Outcome.LAUNCHED


def _skipped(run: RunRecord, iteration: int, trigger_id: str, services: Services) -> Outcome:
    """The launch of ``iteration`` was claimed by another trigger: logged with that claim. A claim no launch wrote
    (without the time, workers and generation every launch's claim holds: an item put behind the pipeline's back)
    fails the run naming it, since nothing launched the workers; another launch's claim launched them."""
    claimed = services.table.get_counter(run.run_id, iteration)
    log = {"run_id": run.run_id, "iteration": iteration, "trigger": trigger_id, "claimed_by": claimed.launched_by}
    if claimed.launched_at is not None and claimed.workers is not None and "generation" in claimed.model_fields_set:
        logger.info("launch skipped: the iteration's launch was claimed by another trigger", extra=log)
        return Outcome.ALREADY_LAUNCHED
    reason = (
        f"the launch of iteration {iteration} was claimed behind the pipeline's back: its {iteration_sk(iteration)}"
        f" item names {claimed.launched_by!r}, which launched nothing"
    )
    logger.error("launch skipped: run failed", extra={**log, "reason": reason})
    services.fail_run(run.run_id, reason)
    return Outcome.REFUSED


def asynchronous_launches(services: Services, run_id: str, iteration: int, workers: int, budget: int) -> dict[int, int]:
    """ASP: the workers launched on model version ``iteration`` (``freed``) → the number of the update each computes
    (``barrier.asynchronous_updates``): none past the run's ``budget`` of iterations."""
    return barrier.asynchronous_updates(iteration, freed(services, run_id, iteration, workers), workers, budget)


def freed(services: Services, run_id: str, iteration: int, workers: int) -> list[int]:
    """ASP: the workers model version ``iteration`` frees: all of them on the first, else those whose updates made
    it (read by key)."""
    if iteration == 0:
        return list(range(workers))
    return [p.worker for p in services.table.made_by(run_id, iteration, workers)]


def launch(run: RunRecord, iteration: int, trigger_id: str, services: Services, ahead: bool = False) -> Outcome:
    """Launch the workers of ``iteration`` of ``run`` (once per trigger): what a landed model does, for the watchdog
    to launch an iteration whose GPU fleet it waited for, and for a reduce that fires to launch the next iteration
    ``ahead`` of its model (``stale_weights``)."""
    return _launch(run, iteration, trigger_id, services, ahead)


def _await_fleet(run: RunRecord, iteration: int, services: Services) -> Outcome:
    """The run's GPU fleet is not there yet: start its chain of deadlines with one due in FLEET_POLL_S, at which the
    watchdog launches ``iteration`` if the fleet is there, or looks again."""
    _start_chain(services, run, iteration, time.time() + FLEET_POLL_S)
    logger.info("launch waits for the GPU fleet", extra={"run_id": run.run_id, "iteration": iteration})
    return Outcome.AWAITING_FLEET


def _start_chain(services: Services, run: RunRecord, iteration: int, due_at: float) -> None:
    """Send the first deadline of the run's chain, due at ``due_at``, and record it as the chain's pending one."""
    first = Deadline(
        run_id=run.run_id, iteration=iteration, generation=run.generation, stage="work", round=0, due_at=due_at
    )
    services.deadlines.schedule(first)
    services.table.watch(run.run_id, None, 0, PendingDeadline.model_validate(first.model_dump()))


def _tune(run: RunRecord, iteration: int, services: Services) -> RunRecord:
    """``--workers auto``: the tuner's workers for ``iteration``, from the round before's time (once per
    iteration: a duplicate launch finds the decision stored)."""
    state = run.tuner or tuner.TunerState()
    if state.tuned >= iteration:
        return run
    last = services.table.get_iteration(run.run_id, iteration - 1)
    if last.workers and last.launched_at and last.merged_at:
        state = tuner.measure(state, last.workers, last.merged_at - last.launched_at)
    finite = [r for r in last.reports.values() if r.finite and r.samples]
    per_sample = sum(r.compute_s for r in finite) / max(1, sum(r.samples or 0 for r in finite))
    spec = run.training
    # priced on the deployment's workers: GPU instances where it has them
    predict = tuner.predictor(run_config(services, run.run_id), per_sample, services.limits)
    decision = tuner.decide(state, iteration, run.workers, spec.objective, spec.worker_bounds, predict)
    changed = decision.workers != run.workers
    if changed:
        logger.info(
            "tuner changes the workers",
            extra={
                "run_id": run.run_id,
                "iteration": iteration,
                "workers": decision.workers,
                "reason": decision.reason,
            },
        )
    tuned = services.table.tune(
        run.run_id, iteration, decision.state, run.workers, decision.workers, decision.reason if changed else None
    )
    return tuned or services.table.get_run(run.run_id)


def on_run_started(started: RunStarted, services: Services) -> None:
    """Keep the execution's task token; answer it at once if the run already ended (a fast run, or one failed or
    stopped before its execution waited: whoever ended it found no token to answer). A resumed run is launched from
    here: its current model is in place already."""
    run = services.table.attach_task_token(started.run_id, started.task_token)
    if run is None:
        services.orchestrator.fail(started.task_token, f"run {started.run_id!r} is not registered")
    elif run.status == RunStatus.FAILED:
        services.orchestrator.fail(started.task_token, run.reason or "the run failed")
    elif run.status == RunStatus.STOPPED:
        services.orchestrator.stop(started.task_token, run.reason or "the run was stopped")
    elif run.final_key:
        services.orchestrator.succeed(started.task_token, outcome(run))
    elif run.generation and services.store.exists(keys.trigger(run.run_id, run.iteration)):
        _launch(run, run.iteration, f"resume-{run.generation}", services)
