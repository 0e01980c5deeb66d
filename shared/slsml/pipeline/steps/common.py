"""What several steps share: the run's immutable config, failing a run on bad input."""

from __future__ import annotations

import numpy as np
from aws_lambda_powertools import Logger

from slsml.aws import cache
from slsml.aws.storage import ObjectStore
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.spec.errors import NotFoundError, RunFailed

logger = Logger(child=True)


def run_config(store: ObjectStore, run_id: str) -> RunConfig:
    """``runs/<run>/run.json``, kept in the warm cache (it never changes)."""
    warm = cache.warm()
    config = warm.get(("config", run_id))
    if config is None:
        try:
            body = store.get(keys.run_config(run_id))
        except NotFoundError:
            raise RunFailed(f"run {run_id!r} has no run.json: it was not started with slsml") from None
        config = RunConfig.model_validate_json(body)
        warm.put(("config", run_id), config, cache.PARSED_BYTES_PER_JSON_BYTE * len(body))
    return config


def load_weights(store: ObjectStore, config: RunConfig, iteration: int) -> np.ndarray:
    """The flat weights entering ``iteration`` (one object, stored by the Merger)."""
    return store.get_array(keys.weights(config.run_id, iteration))
