"""What several steps share: the run's immutable config, its carried state, finishing a run."""

from __future__ import annotations

from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from slsml import rules
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


def carried_state(config: RunConfig, iteration: int) -> list[str]:
    """The keys of the carried state entering ``iteration`` (``keys.carried``): the slots of every worker the run
    may have (``run scale`` and ``--workers auto`` move within its bounds), where its rule and compression keep
    slot states and residuals."""
    spec, plan = config.training, config.plan
    slot_state = rules.of(spec).slot_traffic(spec, plan.size, int(plan.trainable_mask().sum())).bytes > 0
    return keys.carried(config.run_id, iteration, config.reducers, spec.worker_bounds[1], slot_state,
                        spec.compression.lossy)


def complete_run(services: Services, run_id: str, iteration: int) -> None:
    """The iteration budget is spent and the final model (the one entering ``iteration``) evaluated: store it as
    the run's final model with its test figures, and end the run's execution."""
    final_key = keys.final_model(run_id)
    services.store.copy_new(keys.model(run_id, iteration), final_key)
    last = services.table.get_counter(run_id, iteration - 1)
    run = services.table.record_outcome(run_id, final_key, last.test, last.val)
    if run is not None:
        services.orchestrator.succeed(run.task_token, outcome(run))
        # nothing resumes a completed run: its last two sets of carried state go (the Merger deleted the others)
        config = run_config(services.store, run_id)
        services.store.delete([*carried_state(config, iteration - 1), *carried_state(config, iteration)])
    logger.info("run completed", extra={"run_id": run_id, "iterations": iteration, "final": final_key})


def outcome(run: RunRecord) -> dict[str, Any]:
    """What a run's execution ends with."""
    return {"final_key": run.final_key, "iterations": run.iteration, "test_accuracy": run.test_accuracy,
            "test_loss": run.test_loss, "test": run.test, "val": run.val}
