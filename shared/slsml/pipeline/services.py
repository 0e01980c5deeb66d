"""The AWS resources a pipeline function uses, found from its environment, and a run's immutable config."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

from aws_lambda_powertools import Logger
from pydantic import ValidationError

from slsml.accounting import usage
from slsml.aws import cache as warm_cache
from slsml.aws import clients as aws
from slsml.aws.storage import ObjectStore
from slsml.pipeline.bus import Bus
from slsml.pipeline.deadlines import DeadlineQueue
from slsml.pipeline.proof import RunKeys
from slsml.spec import keys, wiring
from slsml.spec.config import RunConfig, config_digest
from slsml.spec.deployment import SERVICE_NAME
from slsml.spec.errors import BadInputError, ConfigReplaced, NotFoundError, RunFailed, SlsmlError, described
from slsml.spec.limits import RunLimits
from slsml.spec.messages import Deadline
from slsml.state.orchestration import Orchestrator
from slsml.state.records import RunRecord
from slsml.state.runtable import RunTable

# named by the service explicitly: the local host's fork server imports this module before a function's environment
# is set, and a child logger of an unset service would reach no handler
logger = Logger(service=SERVICE_NAME, child=True)


@dataclass
class Services:
    store: ObjectStore
    table: RunTable
    bus: Bus
    orchestrator: Orchestrator
    deadlines: DeadlineQueue
    keys: RunKeys  # runs' signing keys: what signs the messages sent and checks those received
    limits: RunLimits = field(default_factory=RunLimits)  # the deployment's, which every run must keep within
    # what this step's role may tell a run's execution (the wiring's ``answers``; a client: everything)
    answers: frozenset[wiring.TaskAnswer] = frozenset(wiring.TaskAnswer)

    @classmethod
    def from_names(
        cls,
        bucket: str,
        table: str,
        topic_arns: dict[str, str],
        state_machine_arn: str | None = None,
        deadline_queue_url: str | None = None,
        limits: RunLimits | None = None,
        kind: str | None = None,
    ) -> Services:
        """The services of the deployment named, for its function ``kind`` (None: its owner, a client); the key that
        seals runs' signing keys is the environment's (``wiring.SIGNING_KEY_ENV``)."""
        run_table = RunTable(aws.resource("dynamodb").Table(table))
        run_keys = RunKeys(run_table, aws.client("kms"), os.environ.get(wiring.SIGNING_KEY_ENV), kind)
        return cls(
            store=ObjectStore(aws.client("s3"), bucket),
            table=run_table,
            bus=Bus(aws.client("sns"), topic_arns, run_keys.sign),
            orchestrator=Orchestrator(aws.client("stepfunctions"), state_machine_arn),
            deadlines=DeadlineQueue(aws.client("sqs"), deadline_queue_url, run_keys.sign),
            keys=run_keys,
            limits=limits or RunLimits(),
        )

    def stop_run(self, run_id: str, reason: str = "stopped by the user") -> bool:
        """Stop a running run: its execution ends, no new iteration starts, in-flight work drains."""
        run = self.table.stop(run_id, reason)
        if run is not None:
            self._end_execution(run, lambda: self.orchestrator.stop(run.task_token, reason))
        return run is not None

    def fail_run(self, run_id: str, reason: str) -> bool:
        """Fail a running run with ``reason`` and end its execution; False if it was not running."""
        run = self.table.fail(run_id, reason)
        if run is not None:
            self._end_execution(run, lambda: self.orchestrator.fail(run.task_token, reason))
        return run is not None

    def _end_execution(self, run: RunRecord, answer: Callable[[], None]) -> None:
        """Tell the run's execution it ended (the table says how), or, from a step whose role may not, ask the
        watchdog to."""
        if wiring.TaskAnswer.FAILURE in self.answers:
            answer()
        else:
            self.ask_watchdog(run.run_id, run.iteration, run.generation)

    def ask_watchdog(self, run_id: str, iteration: int, generation: int) -> None:
        """Have the watchdog answer the run's execution as its record says now (it ended, or its final evaluation is
        in): a deadline of stage ``end``, due now, beside the run's chain of deadlines."""
        self.deadlines.schedule(
            Deadline(
                run_id=run_id, iteration=iteration, generation=generation, stage="end", round=0, due_at=time.time()
            )
        )


def run_config(services: Services, run_id: str) -> RunConfig:
    """``runs/<run>/run.json``, checked against the digest its run registered (``registered_config``: its run item is
    read with it), kept in the warm cache (it never changes)."""
    warm = warm_cache.warm()
    config = warm.get(("config", run_id))
    if config is None:
        with usage.warming():  # once per container and run, whichever iteration brings it here
            config, size = _registered(services.store, run_id, lambda: services.table.get_run(run_id))
        warm.put(("config", run_id), config, warm_cache.PARSED_BYTES_PER_JSON_BYTE * size)
    return config


def registered_config(store: ObjectStore, run: RunRecord) -> RunConfig:
    """``run``'s ``run.json``: RunFailed if there is none or it is not slsml's; ConfigReplaced, naming it, if its
    SHA-256 is not the one the run registered (``RunRecord.config_sha256``)."""
    return _registered(store, run.run_id, lambda: run)[0]


def _registered(store: ObjectStore, run_id: str, run: Callable[[], RunRecord]) -> tuple[RunConfig, int]:
    key = keys.run_config(run_id)
    try:
        body = store.get(key)
    except NotFoundError:
        raise RunFailed(f"run {run_id!r} has no run.json: it was not started with slsml") from None
    try:
        config = RunConfig.model_validate_json(body)
    except ValidationError as error:
        problem = described(error, RunConfig)
        raise RunFailed(f"run {run_id!r} has a run.json that is not slsml's: {problem}") from None
    try:
        registered = run().config_sha256
    except NotFoundError:
        raise RunFailed(f"run {run_id!r} is not registered: it was not started with slsml") from None
    if (found := config_digest(body)) != registered:
        raise ConfigReplaced(
            f"{key} is not the run.json run {run_id!r} registered: it was replaced behind the pipeline's back"
            f" (its SHA-256 is {found}; the run registered {registered})"
        )
    return config, len(body)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SlsmlError(f"environment variable {name} is not set: is this function deployed by slsml?")
    return value


def from_env(function: str | None = None) -> Services:
    """The services of deployed function ``function`` (its wiring name): bucket, table, the topics it may publish
    to, the deployment's run limits and what it may tell a run's execution. Made once per function and run limits
    (the local host sets a deployment's changed limits for each invocation)."""
    return deployment_services(function, os.environ.get(wiring.RUN_LIMITS_ENV) or "{}")


@cache
def deployment_services(function: str | None, limits: str) -> Services:
    """The services of deployed function ``function`` under the deployment's run limits ``limits`` (JSON)."""
    topics = {t.name: os.environ[t.env_var] for t in wiring.TOPICS if os.environ.get(t.env_var)}
    services = Services.from_names(
        _env(wiring.BUCKET_ENV),
        _env(wiring.TABLE_ENV),
        topics,
        os.environ.get(wiring.STATE_MACHINE_ENV),
        os.environ.get(wiring.DEADLINES.env_var),
        RunLimits.model_validate_json(limits),
        function,
    )
    if function is not None:
        services.answers = frozenset(wiring.function(function).answers)
    return services


def superseded(services: Services, run_id: str, iteration: int, generation: int) -> bool:
    """Whether the carried state entering ``iteration`` of ``generation`` may have been deleted as superseded
    (``steps.merger``): the run advanced two iterations past it, finished, or was resumed in another generation."""
    run = services.table.get_run(run_id)
    return run.final_key is not None or run.generation != generation or run.iteration >= iteration + 2


@contextmanager
def failing_run_on_bad_input(
    services: Services, run_id: str, stage: str, iteration: int | None = None, generation: int | None = None
) -> Iterator[None]:
    """Bad input fails the run with a reason (no retries: retrying cannot fix it). An object missing to a step of
    ``iteration`` of ``generation`` whose carried state was superseded fails nothing: the step is late, and is
    dropped like any late step; an object of the run missing otherwise was deleted behind the pipeline's back, and
    the reason says so."""
    try:
        yield
    except (BadInputError, RunFailed, NotFoundError) as error:
        if (
            isinstance(error, NotFoundError)
            and iteration is not None
            and generation is not None
            and superseded(services, run_id, iteration, generation)
        ):
            logger.info(
                "late step dropped: what it reads was superseded",
                extra={
                    "run_id": run_id,
                    "iteration": iteration,
                    "generation": generation,
                    "stage": stage,
                    "missing": str(error),
                },
            )
            return
        reason = f"{stage}: {error}"
        if isinstance(error, NotFoundError) and f"/{keys.run_prefix(run_id)}" in str(error):
            # the pipeline deletes a run's objects once the run moved past them alone (``superseded``)
            reason += ", though the run has not moved past it: it was deleted behind the pipeline's back"
        logger.error("run failed", extra={"run_id": run_id, "reason": reason})
        services.fail_run(run_id, reason)
