"""What several steps share: the run's immutable config, failing a run on bad input."""

from __future__ import annotations

import numpy as np
from aws_lambda_powertools import Logger

from slsml.aws.storage import ObjectStore
from slsml.pipeline.services import run_config as run_config  # read by the admission of messages too
from slsml.spec import keys
from slsml.spec.config import RunConfig

logger = Logger(child=True)


def load_weights(store: ObjectStore, config: RunConfig, iteration: int) -> np.ndarray:
    """The flat weights entering ``iteration`` (one object, stored by the Merger)."""
    return store.get_array(keys.weights(config.run_id, iteration))
