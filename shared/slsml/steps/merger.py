"""Merger: when every shard of an iteration is in, assemble and upload the next model (the trigger
of the next iteration), evaluating it on the test set when due."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from slsml import keys, modelio
from slsml.errors import RunFailed
from slsml.messages import ReduceDone
from slsml.runstate import RunStatus
from slsml.services import Services
from slsml.steps.common import load_weights, run_config
from slsml.steps.warm import reader_for, trainer_for

logger = Logger(child=True)
MERGED_METADATA = "merged-from"  # on a model the Merger stored: the iteration whose shards it assembled


def on_reduce_done(message: ReduceDone, services: Services) -> str | None:
    """Record the shard; returns the key of the next model if this message completed the iteration."""
    store = services.store
    store.reset_counters()
    config = run_config(store, message.run_id)
    run, iteration = message.run_id, message.iteration
    record = services.table.record_shard(run, iteration, message.shard, (message.bytes_read, message.bytes_written))
    if len(record.shards) < config.reducers or not services.table.fire_merge(run, iteration, message.shard):
        return None
    next_key = keys.model(run, iteration + 1)
    stored = store.head(next_key)
    if stored is not None:  # merged before (a retry, or a resumed run), unless something else put it there
        if stored.get(MERGED_METADATA) != str(iteration):
            raise RunFailed(f"{next_key} was stored by something other than this run's Merger: it is not"
                            " overwritten, and the run cannot go on without its own model there")
        return None
    if services.table.get_run(run).status != RunStatus.RUNNING:
        return None
    trainer, _ = trainer_for(store, config, iteration)
    modelio.set_flat(trainer.model, config.plan, load_weights(store, config, iteration + 1))
    test = None
    every = config.training.eval_every
    if iteration + 1 == config.training.iterations or (every and (iteration + 1) % every == 0):
        reader = reader_for(store, config.dataset)
        test = trainer.evaluate(*reader.split("test"))
    body = modelio.save_model(trainer.model)
    services.table.record_merge(run, iteration, (store.bytes_read, store.bytes_written + len(body)), test)
    advanced = services.table.advance(run, iteration + 1)
    if advanced is not None:
        services.orchestrator.heartbeat(advanced.task_token)
    store.put_new(next_key, body, {MERGED_METADATA: str(iteration)})
    logger.info("model merged", extra={"run_id": run, "iteration": iteration + 1, "test": test})
    return next_key
