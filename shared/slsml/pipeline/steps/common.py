"""What several steps share: the run's immutable config, finishing a run."""

from __future__ import annotations

from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from slsml.aws.storage import ObjectStore
from slsml.pipeline.services import Services
from slsml.pipeline.services import run_config as run_config  # read by the admission of messages too
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.state.records import RunRecord

logger = Logger(child=True)


def load_weights(store: ObjectStore, config: RunConfig, iteration: int) -> np.ndarray:
    """The flat weights entering ``iteration`` (one object, stored by the Merger)."""
    return store.get_array(keys.weights(config.run_id, iteration))


def complete_run(services: Services, run_id: str, iteration: int) -> None:
    """The iteration budget is spent and the final model (the one entering ``iteration``) evaluated: store it as
    the run's final model with its test figures, and end the run's execution."""
    final_key = keys.final_model(run_id)
    services.store.copy_new(keys.model(run_id, iteration), final_key)
    last = services.table.get_counter(run_id, iteration - 1)
    run = services.table.record_outcome(run_id, final_key, last.test, last.val)
    if run is not None:
        services.orchestrator.succeed(run.task_token, outcome(run))
    logger.info("run completed", extra={"run_id": run_id, "iterations": iteration, "final": final_key})


def outcome(run: RunRecord) -> dict[str, Any]:
    """What a run's execution ends with."""
    return {"final_key": run.final_key, "iterations": run.iteration, "test_accuracy": run.test_accuracy,
            "test_loss": run.test_loss, "test": run.test, "val": run.val}
