"""RunStarter: a model dropped under ``incoming/`` (no CLI) → a run with the deployment's defaults."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re

import pydantic_core
from aws_lambda_powertools import Logger
from pydantic import ValidationError

from slsml.pipeline import launch, metrics
from slsml.pipeline.services import Services
from slsml.spec import keys, wiring
from slsml.spec.config import DropInRequest, RunConfig, TrainingSpec
from slsml.spec.deployment import Metric
from slsml.spec.errors import BadInputError, NotFoundError, SlsmlError, described, problems
from slsml.spec.messages import ModelLanded
from slsml.training import bounds

logger = Logger(child=True)


def deployment_defaults() -> DropInRequest:
    return DropInRequest.model_validate_json(os.environ.get(wiring.RUN_DEFAULTS_ENV) or "{}")


def on_dropped(landed: ModelLanded, services: Services, defaults: DropInRequest) -> str | None:
    """Start the run of ``incoming/<name>.keras``; returns its id (None if nothing was started). A start that
    cannot be made registers its run FAILED with the reason (unless a run of that id exists: then it is logged
    and counted alone)."""
    name = keys.parse_incoming_key(landed.key)
    if name is None:
        logger.info("object is not a dropped model: ignored", extra={"key": landed.key})
        return None
    limits = bounds.Limits.here()
    try:
        model_bytes = services.store.get_bounded(landed.key, limits.archive_bytes, limits.describe())
        sidecar = _sidecar(services, name)
    except BadInputError as error:  # too large to read: the run id is the refusal's, which names the sizes
        _refuse(services, landed.key, f"{_slug(name)}-{_digest(str(error).encode())}", None, TrainingSpec(), error)
        return None
    # one run per uploaded model and request: a redelivered event finds the run already there, a corrected
    # request beside the same model starts a run of its own
    run_id = f"{_slug(name)}-{_digest(model_bytes + (sidecar or b''))}"
    if _registered(services, run_id):
        logger.info("dropped model already started", extra={"key": landed.key, "run_id": run_id})
        return run_id
    request, spec = DropInRequest(), TrainingSpec()
    try:
        request, spec = _request(sidecar, name, defaults)
        if request.dataset is None:
            raise BadInputError(
                f'no dataset for {landed.key}: put {{"dataset": ...}} in {keys.incoming_request(name)}'
                " or in the deployment's run defaults"
            )
        if services.store.exists(keys.run_config(run_id)):
            _launch_prepared(services, run_id)
        else:
            # a request beyond the deployment's limits is started too, for the pipeline to fail it with the
            # reason: whoever dropped the model sees it as a FAILED run
            launch.start_run(services, model_bytes, request.dataset, spec, run_id=run_id, check_limits=False)
    except (SlsmlError, ValidationError) as error:
        _refuse(services, landed.key, run_id, request.dataset, spec, error)
        return None
    logger.info("run started from a dropped model", extra={"key": landed.key, "run_id": run_id})
    return run_id


def _refuse(
    services: Services, key: str, run_id: str, dataset: str | None, spec: TrainingSpec, error: Exception
) -> None:
    """Register the dropped model's run FAILED with the reason (a run of that id already there is left as it is)."""
    reason = described(error) if isinstance(error, ValidationError) else str(error)
    logger.error("dropped model not started", extra={"key": key, "run_id": run_id, "reason": reason})
    metrics.emit(Metric.REFUSED_STARTS, 1)
    if not services.table.register_refused(run_id, dataset or "", spec, f"{key} not started: {reason}"):
        logger.error(
            "a run of the dropped model's id is registered already: left as it is", extra={"key": key, "run_id": run_id}
        )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:8]


def _registered(services: Services, run_id: str) -> bool:
    try:
        services.table.get_run(run_id)
        return True
    except NotFoundError:
        return False


def _launch_prepared(services: Services, run_id: str) -> None:
    """Launch a run whose files an earlier start wrote before it was interrupted (``source.keras`` is written
    last); one whose files are incomplete is refused."""
    if not services.store.exists(keys.source_model(run_id)):
        raise SlsmlError(f"an earlier start of run {run_id!r} was interrupted before its files were all written")
    stored = services.store.get(keys.run_config(run_id))
    launch.launch_run(services, RunConfig.model_validate_json(stored), stored)


def _sidecar(services: Services, name: str) -> bytes | None:
    try:
        return services.store.get_bounded(keys.incoming_request(name), bounds.SIDECAR_MAX_BYTES, "a run request")
    except NotFoundError:
        return None


def _request(sidecar: bytes | None, name: str, defaults: DropInRequest) -> tuple[DropInRequest, TrainingSpec]:
    """The run request beside a dropped model (parsed by pydantic's JSON parser, whose nesting is bounded) over the
    deployment's ``defaults``, and the spec it trains with; BadInputError naming every problem of it at once, its
    training's among them."""
    found: list[str] = []
    request = DropInRequest()
    if sidecar is not None:
        try:
            request = DropInRequest.model_validate_json(sidecar)
        except ValidationError as error:
            found = problems(error, DropInRequest)
            with contextlib.suppress(ValueError):  # a request that is JSON: its training is checked too
                given = pydantic_core.from_json(sidecar)
                if isinstance(given, dict) and isinstance(given.get("training"), dict):
                    request = DropInRequest(training=given["training"])
    request = request.over(defaults)
    spec = TrainingSpec()
    try:
        spec = TrainingSpec.model_validate(request.training)
    except ValidationError as error:
        found += problems(error, TrainingSpec, under="training")
    if found:
        source = "the deployment's run defaults" if sidecar is None else keys.incoming_request(name)
        raise BadInputError(f"{source} is not a valid run request: {'; '.join(found)}")
    return request, spec


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "model"
