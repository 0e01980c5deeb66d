"""RunStarter: a model dropped under ``incoming/`` (no CLI) → a run with the deployment's defaults."""

from __future__ import annotations

import hashlib
import os
import re

from aws_lambda_powertools import Logger
from pydantic import ValidationError

from slsml.client import runs
from slsml.pipeline.services import Services
from slsml.spec import keys, wiring
from slsml.spec.config import DropInRequest, TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError, SlsmlError
from slsml.spec.messages import ModelLanded

logger = Logger(child=True)


def deployment_defaults() -> DropInRequest:
    return DropInRequest.model_validate_json(os.environ.get(wiring.RUN_DEFAULTS_ENV) or "{}")


def on_dropped(landed: ModelLanded, services: Services, defaults: DropInRequest) -> str | None:
    """Start the run of ``incoming/<name>.keras``; returns its id (None if nothing was started)."""
    name = keys.parse_incoming_key(landed.key)
    if name is None:
        logger.info("object is not a dropped model: ignored", extra={"key": landed.key})
        return None
    model_bytes = services.store.get(landed.key)
    # one run per uploaded object: a redelivered event finds the run already there
    run_id = f"{_slug(name)}-{hashlib.sha256(model_bytes).hexdigest()[:8]}"
    try:
        request = _request(services, name).over(defaults)
        if request.dataset is None:
            raise BadInputError(
                f"no dataset for {landed.key}: put {{\"dataset\": ...}} in {keys.incoming_request(name)}"
                " or in the deployment's run defaults"
            )
        spec = TrainingSpec.model_validate(request.training)
        # a request beyond the deployment's limits is started too, for the pipeline to fail it with the reason:
        # whoever dropped the model sees it as a FAILED run
        runs.start_run(services, model_bytes, request.dataset, spec, run_id=run_id, check_limits=False)
    except (SlsmlError, ValidationError) as error:
        logger.error("dropped model not started", extra={"key": landed.key, "run_id": run_id, "reason": str(error)})
        return None
    logger.info("run started from a dropped model", extra={"key": landed.key, "run_id": run_id})
    return run_id


def _request(services: Services, name: str) -> DropInRequest:
    """The run request beside a dropped model (parsed by pydantic's JSON parser, whose nesting is bounded)."""
    try:
        return DropInRequest.model_validate_json(services.store.get(keys.incoming_request(name)))
    except NotFoundError:
        return DropInRequest()
    except ValidationError as error:
        raise BadInputError(f"{keys.incoming_request(name)} is not a valid run request: {error}") from None


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "model"
