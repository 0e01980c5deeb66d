"""Following a run, resuming and scaling it, and summing it up (a run starts by ``slsml.pipeline.launch``). Used by
the CLI, the local runtime and tests."""

from __future__ import annotations

import hashlib
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, computed_field, model_validator

from slsml.accounting import prices, usage
from slsml.cost.messages import check_messages
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.pipeline.services import Services, registered_config
from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError, SlsmlError
from slsml.state.records import Counter, IterationRecord, RunRecord, RunStatus

TERMINAL = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED}
RESTING_POLL_S = 1.0  # the longest wait between two reads of a run that has not moved (``wait_for_run``)


def final_model(services: Services, run: RunRecord) -> bytes:
    """The final model the run stored. SlsmlError if the object at its key is another one now: final.keras is a
    server-side copy, which a create-only bucket policy cannot cover, so the run records its ETag and SHA-256 and
    readers check both, the SHA-256 of the bytes handed out (with bucket versioning on, the replaced version is
    kept)."""
    if run.final_key is None:
        raise NotFoundError(f"run {run.run_id} has no final model (status {run.status.value})")
    stored = services.store.read(run.final_key)
    if run.final_etag is not None and stored.etag != run.final_etag:
        raise SlsmlError(
            f"{run.final_key} is not the final model run {run.run_id!r} stored: it was replaced since"
            f" (ETag {stored.etag}; the run recorded {run.final_etag})"
        )
    if run.final_sha256 is not None and (read := hashlib.sha256(stored.body).hexdigest()) != run.final_sha256:
        raise SlsmlError(
            f"{run.final_key} is not the final model run {run.run_id!r} stored: its bytes as read have the SHA-256"
            f" {read}; the run recorded {run.final_sha256}"
        )
    return stored.body


def saved_model(services: Services, run_id: str, iteration: int) -> bytes:
    """The model entering ``iteration`` as the run saved it (the initial model, a checkpoint, an evaluated model);
    NotFoundError naming the iterations it saved models of otherwise. SlsmlError if its bytes are not those the run
    recorded: the initial model's SHA-256 in the run's config, each model the Merger saved in the run's table."""
    run = services.table.get_run(run_id)  # NotFoundError naming an unknown run
    key = keys.model(run_id, iteration)
    if services.store.exists(key):
        body = services.store.get(key)
        if iteration:
            recorded = services.table.saved_sha256(run_id, iteration)
        else:
            recorded = registered_config(services.store, run).source_sha256
        if (read := hashlib.sha256(body).hexdigest()) != recorded:
            said = "recorded none" if recorded is None else f"recorded {recorded}"
            raise SlsmlError(
                f"{key} is not the model run {run_id!r} saved: its bytes as read have the SHA-256 {read}; the run"
                f" {said} (it was placed or replaced behind the pipeline's back)"
            )
        return body
    saved = sorted(
        int(k.rsplit("/", 1)[1].removesuffix(keys.MODEL_SUFFIX))
        for k in services.store.list_keys(keys.models_prefix(run_id))
        if k.endswith(keys.MODEL_SUFFIX)
    )
    raise NotFoundError(
        f"run {run_id} saved no model entering iteration {iteration}; it saved those entering"
        f" {', '.join(map(str, saved)) or 'none'} (--checkpoint-every N saves every N-th)"
    )


def last_complete_model(services: Services, run_id: str) -> int | None:
    """The latest iteration whose trigger is stored (the initial model, or a manifest: the shards it names are the
    carried state a run resumes from); None: not even the initial model."""
    keys_found = services.store.list_keys(keys.models_prefix(run_id))
    return max((parsed[1] for key in keys_found if (parsed := keys.parse_model_key(key))), default=None)


def resume_run(services: Services, run_id: str, budget_usd: float | None = None) -> RunRecord:
    """Run a STOPPED or FAILED run on from its last complete model, in a new execution (with a new dollar
    budget, ``budget_usd``, if given). Iterations after that model are run again; what they stored already is
    kept and reused. BadInputError, and nothing changes, for a budget the run cannot take or has spent."""
    run = services.table.get_run(run_id)
    if run.status not in {RunStatus.STOPPED, RunStatus.FAILED}:
        further = (
            f"; to train its model further, start a run with it (`slsml run fetch {run_id}`, then `slsml run start"
            f" --model {run_id}.keras`)"
            if run.status == RunStatus.COMPLETED
            else ""
        )
        raise SlsmlError(f"run {run_id!r} is {run.status}: only a STOPPED or FAILED run can be resumed{further}")
    if run.training.asynchronous:  # its updates in flight when it ended are not known again
        raise BadInputError(
            f"run {run_id!r} trained with staleness unbounded, which cannot resume: fetch its last model"
            f" (`slsml run fetch {run_id} --iteration I`, a checkpoint) and start a new run with it (`--model`)"
        )
    training = _with_budget(services, run, budget_usd)
    config = registered_config(services.store, run)
    _check_pinned_dataset(services, config)
    iteration = last_complete_model(services, run_id)
    if iteration is None:  # it failed before its initial model was placed
        services.store.copy_new(keys.source_model(run_id), keys.model(run_id, 0))
        iteration = 0
    resumed = services.table.resume(run_id, iteration, training)
    if resumed is None:
        raise SlsmlError(f"run {run_id!r} is no longer STOPPED or FAILED: was it resumed meanwhile?")
    services.table.forget_iterations(run_id, iteration)
    services.orchestrator.start(
        launch.execution_input(config, resumed.config_sha256 or "", resume=True, training=resumed.training),
        name=f"{run_id}-resumed-{resumed.generation}",
    )
    return resumed


def _check_pinned_dataset(services: Services, config: RunConfig) -> None:
    """BadInputError in one line, naming the dataset and what to do, where the dataset the run pinned is gone or
    changed: a run resumes on the data it started on or not at all."""
    name = config.dataset
    try:
        data.check_stored(services.store, name, config.dataset_sha256)
    except NotFoundError as error:
        again = f"`slsml data put {name} SOURCE` with the source and options it was put with"
        if services.store.exists(keys.dataset_manifest(name)):
            again = f"`slsml data rm {name}`, then {again}"
        raise BadInputError(
            f"run {config.run_id!r} cannot resume: {error}; put the same data back ({again}), or start a new run"
            " (`slsml run start`)"
        ) from None
    except BadInputError as error:
        raise BadInputError(
            f"run {config.run_id!r} cannot resume: {error}; a run resumes on the data it started on: put that data"
            f" back (`slsml data rm {name}`, then `slsml data put {name} SOURCE` with the source and options it was"
            " put with), or start a new run (`slsml run start`)"
        ) from None


def _with_budget(services: Services, run: RunRecord, budget_usd: float | None) -> TrainingSpec | None:
    """The run's spec with its new budget (None: it keeps its spec). BadInputError for a budget on a run whose
    spend is not counted (started without one), or a budget (new or kept) that the run has spent."""
    budget_usd = run.training.budget_usd if budget_usd is None else budget_usd
    if budget_usd is None:
        return None
    if run.training.budget_usd is None:
        raise BadInputError(
            f"run {run.run_id!r} was started without --budget-usd, so its functions do not count"
            " its spend: a budget is set when a run starts"
        )
    spent = services.table.spent(run.run_id)
    if spent >= budget_usd:
        raise BadInputError(
            f"run {run.run_id!r} has spent {prices.usd(spent)}, at least the budget of"
            f" {prices.usd(budget_usd)}: resume it with a higher --budget-usd"
        )
    if budget_usd == run.training.budget_usd:
        return None
    try:
        return TrainingSpec.model_validate({**run.training.model_dump(), "budget_usd": budget_usd})
    except ValidationError as error:
        raise BadInputError(f"--budget-usd {budget_usd:g}: {error.errors()[0]['msg']}") from None


def scale_run(services: Services, run_id: str, workers: int, reason: str = "run scale") -> RunRecord:
    """Train a run with ``workers`` workers from the next iteration launched on (an iteration keeps the
    workers it was launched with): a RUNNING run's next one, a STOPPED or FAILED run's first once it is
    resumed. BadInputError outside the run's bounds; nothing changes then."""
    run = services.table.get_run(run_id)
    if not run.training.elastic:
        raise BadInputError(
            f"run {run_id!r} trains with algorithm {run.training.algorithm}: each worker keeps its"
            " data partition and its state, which a change of workers would cut anew; its workers"
            " stay fixed"
        )
    if run.status == RunStatus.COMPLETED:
        raise SlsmlError(f"run {run_id!r} is COMPLETED: only a RUNNING, STOPPED or FAILED run can be scaled")
    low, high = run.training.worker_bounds
    if not low <= workers <= high:
        raise BadInputError(
            f"{workers} workers lie outside run {run_id!r}'s bounds of {low} to {high} (set with"
            " --min-workers and --max-workers when a run starts)"
        )
    if refusal := services.limits.refusal(run.training, workers):
        raise BadInputError(refusal)
    check_messages(run.training, workers)
    scaled = services.table.scale_workers(run_id, workers, reason)
    if scaled is None:
        raise SlsmlError(f"run {run_id!r} completed meanwhile: it was not scaled")
    return scaled


def wait_for_run(
    services: Services,
    run_id: str,
    on_progress: Callable[[RunRecord, Counter | None], None] | None = None,
    timeout_s: float | None = None,
    poll_s: float = 0.5,
) -> RunRecord:
    """Poll until the run is COMPLETED or FAILED (or ``timeout_s`` passes: the run is marked FAILED): every
    ``poll_s`` while it moves, and while it does not (the same iteration and status), each wait twice the last,
    up to ``RESTING_POLL_S``: a run that waits on a slow step is read less often, and its end is seen within that.

    ``on_progress`` gets the run and its last merged iteration (None before the first): its counter, or its record
    where the counter's count of reports (a hint, which a duplicate adds to) is past the reduce's participants.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    wait, seen = poll_s, None
    while True:
        run = services.table.get_run(run_id)
        if on_progress is not None:
            latest = services.table.get_counter(run_id, run.iteration - 1) if run.iteration else None
            if latest is not None and latest.reduce_fired_by is not None and latest.arrived > latest.participant_count:
                latest = services.table.get_iteration(run_id, latest.iteration)  # which came late: its records say
            on_progress(run, latest)
        if run.status in TERMINAL:
            return run
        if deadline is not None and time.monotonic() > deadline:
            services.fail_run(run_id, f"no completion within {timeout_s:.0f} s (at iteration {run.iteration})")
            return services.table.get_run(run_id)
        moved, seen = (run.iteration, run.status) != seen, (run.iteration, run.status)
        wait = poll_s if moved else min(2 * wait, max(poll_s, RESTING_POLL_S))
        time.sleep(wait)


class FleetChange(BaseModel):
    """The workers a run trained with from an iteration on, and why."""

    iteration: int
    workers: int
    reason: str | None = None


def fleet(iterations: list[IterationRecord]) -> list[FleetChange]:
    """The run's worker counts over its launched iterations: the first, then each change with its reason."""
    changes: list[FleetChange] = []
    for record in sorted(iterations, key=lambda r: r.iteration):
        if record.workers and (not changes or changes[-1].workers != record.workers):
            changes.append(
                FleetChange(
                    iteration=record.iteration,
                    workers=record.workers,
                    reason=record.workers_reason if changes else None,
                )
            )
    return changes


def first_reaching(iterations: Sequence[Counter], accuracy: float) -> int | None:
    """The first iteration whose merged model reached ``accuracy`` on the test set (None: none did)."""
    return next(
        (c.iteration for c in sorted(iterations, key=lambda c: c.iteration) if (c.test_accuracy or 0) >= accuracy), None
    )


class RunSummary(BaseModel):
    """A run's figures. Its model's test figures are ``test_<name>`` as Keras names them (``test_loss``,
    ``test_accuracy``, ``test_auc``…): the loss and accuracy as fields, the other metrics as extra fields."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _figures_only(cls, data: Any) -> Any:
        """Of the fields it does not declare, a summary read back keeps the model's figures alone (not the
        computed fields it was written with)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k in cls.model_fields or k.startswith(("test_", "val_"))}
        return data

    run_id: str
    started_at: float | None = None  # when it was created, epoch seconds (None: a record that does not say)
    status: RunStatus
    reason: str | None
    iterations: int  # done
    workers: int  # the workers it trained with last
    fleet: list[FleetChange] = []  # the workers it started with, then each change (run scale, the tuner)
    training: TrainingSpec  # what it was started with
    test_accuracy: float | None
    test_loss: float | None
    final_train_loss: float | None
    wall_s: float
    median_iteration_s: float | None
    median_worker_compute_s: float | None
    overhead_share: float | None
    bytes_read_per_iteration: float | None = None  # S3, from the functions' usage lines (slsml.accounting.usage)
    bytes_written_per_iteration: float | None = None
    late_workers: int
    late_folded: int = 0  # late updates a later reduce took (bounded staleness); the others were dropped
    samples_trained: int = 0  # the samples of the updates the reduces applied
    # of the updates applied to a later model version than the one they were computed on (SSP's folded ones, and
    # under ASP, staleness unbounded, most): the iterations applied in between (under ASP updates), mean and most
    # (None: none was)
    staleness_mean: float | None = None
    staleness_max: int | None = None
    stale_updates: int = 0  # updates computed on the weights one round stale (stale_weights)
    dropped_parts: int = 0
    nonfinite_updates: int = 0
    deadlines_fired: int = 0  # reduces the watchdog fired at a deadline, without the missing workers
    relaunched_workers: int = 0
    relaunched_reducers: int = 0
    stale_shards: int = 0
    stale_attempts: int = 0  # reports of superseded attempts or of an earlier generation, ignored
    final_model: str | None = None
    faults: dict[str, Any] | None = None  # what the local runtime injected and how the pipeline fared
    # from the functions' usage lines (slsml.accounting.usage), priced by slsml.accounting.prices; None without them
    requests_per_iteration: dict[str, float] | None = None  # service:Operation → median over iterations
    gb_seconds: float | None = None  # Lambda: each invocation's duration × its memory
    cost_usd: float | None = None
    cost_per_iteration_usd: float | None = None  # median over iterations
    cost_by_service_usd: dict[str, float] | None = None
    budget_usd: float | None = None  # the run's dollar budget (--budget-usd)
    spent_usd: float | None = None  # what its functions counted as they went (a run with a budget)

    @property
    def test(self) -> dict[str, float]:
        """The test figures by Keras name: ``loss``, then the metrics."""
        extra = {k.removeprefix("test_"): v for k, v in (self.model_extra or {}).items() if k.startswith("test_")}
        return {
            k: v for k, v in {"loss": self.test_loss, "accuracy": self.test_accuracy}.items() if v is not None
        } | extra

    @property
    def val(self) -> dict[str, float]:
        """The validation figures by Keras name (without ``val_``)."""
        return {k.removeprefix("val_"): v for k, v in (self.model_extra or {}).items() if k.startswith("val_")}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reducers(self) -> int:
        return self.training.reducers

    @computed_field  # type: ignore[prop-decorator]
    @property
    def quorum(self) -> float:
        return self.training.quorum


def summarize(
    run: RunRecord,
    iterations: list[IterationRecord],
    wall_s: float,
    usage_records: list[usage.UsageRecord] | None = None,
    spent_usd: float | None = None,
) -> RunSummary:
    """Figures of a run: how an iteration's time splits between worker compute and the rest, and,
    given the functions' usage records of the run, its requests and cost (``prices.load()``); its budget, and
    the spend its functions counted (``slsml.pipeline.spend.spent``)."""
    launched = sorted((r for r in iterations if r.launched_at), key=lambda r: r.iteration)
    cycle = [b.launched_at - a.launched_at for a, b in itertools.pairwise(launched) if a.launched_at and b.launched_at]
    done = [r for r in launched[: len(cycle)] if r.reports]
    compute = [max(rep.compute_s for rep in r.reports.values()) for r in done]
    merged = [r for r in iterations if r.merged_at]
    median_cycle = statistics.median(cycle) if cycle else None
    median_compute = statistics.median(compute) if compute else None
    last_loss = max(merged, key=lambda r: r.iteration).train_loss if merged else None
    stale = [r.iteration - p.iteration for r in iterations for p in r.participants if p.iteration is not None]
    return RunSummary(
        run_id=run.run_id,
        started_at=run.created_at,
        status=run.status,
        reason=run.reason,
        iterations=run.iteration,
        workers=run.workers,
        training=run.training,
        test_accuracy=run.test_accuracy,
        test_loss=run.test_loss,
        **{f"test_{name}": value for name, value in (run.test or {}).items() if name not in {"loss", "accuracy"}},
        **{f"val_{name}": value for name, value in (run.val or {}).items()},
        final_train_loss=last_loss,
        wall_s=round(wall_s, 3),
        median_iteration_s=median_cycle,
        median_worker_compute_s=median_compute,
        overhead_share=(1 - median_compute / median_cycle) if median_cycle and median_compute else None,
        late_workers=sum(len(r.late - r.nonfinite) for r in iterations),
        late_folded=sum(len(r.folded) for r in iterations),
        samples_trained=sum(p.samples for r in iterations for p in r.participants),
        staleness_mean=statistics.mean(stale) if stale else None,
        staleness_max=max(stale, default=None),
        stale_updates=sum(len(r.stale) for r in iterations),
        dropped_parts=sum(len(r.dropped_parts) for r in iterations),
        nonfinite_updates=sum(len(r.nonfinite) for r in iterations),
        deadlines_fired=sum(r.fired_at_deadline for r in iterations),
        relaunched_workers=sum(len(r.relaunched) for r in iterations),
        relaunched_reducers=sum(r.reduce_relaunches for r in iterations),
        stale_shards=sum(len(r.stale_shards) for r in iterations),
        stale_attempts=sum(r.stale_attempts for r in iterations),
        final_model=run.final_key,
        fleet=fleet(iterations),
        budget_usd=run.training.budget_usd,
        spent_usd=spent_usd,
        **(usage.figures(usage_records, run.iteration, prices.load()) if usage_records else {}),
    )
