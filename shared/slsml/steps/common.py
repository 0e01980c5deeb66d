"""What several steps share: the run's immutable config, failing a run on bad input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from aws_lambda_powertools import Logger

from slsml import keys
from slsml.config import RunConfig
from slsml.errors import BadInputError, NotFoundError, RunFailed
from slsml.services import Services
from slsml.storage import ObjectStore

logger = Logger(child=True)
_configs: dict[str, RunConfig] = {}


def run_config(store: ObjectStore, run_id: str) -> RunConfig:
    """``runs/<run>/run.json``, read once per warm container (it never changes)."""
    config = _configs.get(run_id)
    if config is None:
        try:
            config = _configs[run_id] = RunConfig.model_validate(store.get_json(keys.run_config(run_id)))
        except NotFoundError:
            raise RunFailed(f"run {run_id!r} has no run.json: it was not started with slsml") from None
    return config


def load_weights(store: ObjectStore, config: RunConfig, iteration: int) -> np.ndarray:
    """The flat weights entering ``iteration`` (one object, stored by the Merger)."""
    return store.get_array(keys.weights(config.run_id, iteration))


@contextmanager
def failing_run_on_bad_input(services: Services, run_id: str, stage: str) -> Iterator[None]:
    """Bad input fails the run with a reason (no retries: retrying cannot fix it)."""
    try:
        yield
    except (BadInputError, RunFailed, NotFoundError) as error:
        reason = f"{stage}: {error}"
        logger.error("run failed", extra={"run_id": run_id, "reason": reason})
        services.fail_run(run_id, reason)
