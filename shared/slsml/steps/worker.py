"""Worker: compute the update of one slice of a global batch and split it for the reducers. An update
with NaN or Inf is stored and announced like any other but marked non-finite, so that it is left out."""

from __future__ import annotations

import json
import time

import numpy as np
from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit

from slsml import data, keys, metrics, modelio, updates, wiring
from slsml.config import RunConfig
from slsml.deployment import Metric
from slsml.errors import RunFailed
from slsml.messages import WorkDone, WorkMessage
from slsml.services import Services
from slsml.steps.common import load_weights, run_config
from slsml.steps.warm import reader_for, trainer_for

logger = Logger(child=True)


def work(message: WorkMessage, services: Services) -> WorkDone:
    config = run_config(services.store, message.run_id)
    if message.worker >= config.workers:
        raise RunFailed(f"work message for worker {message.worker} but the run has {config.workers} workers")
    done = _compute(message, config, services)
    services.bus.publish(wiring.WORK_DONE, [done])
    metrics.emit(Metric.WORKER_COMPUTE_SECONDS, done.compute_s, MetricUnit.Seconds)
    if done.finite:  # a non-finite update is announced with no loss
        metrics.emit(Metric.TRAIN_LOSS, done.loss, MetricUnit.NoUnit)
    return done


def _compute(message: WorkMessage, config: RunConfig, services: Services) -> WorkDone:
    store = services.store
    trainer, fresh = trainer_for(store, config, message.iteration)
    if not fresh:
        modelio.set_flat(trainer.model, config.plan, load_weights(store, config, message.iteration))
    reader = reader_for(store, config.dataset)
    batch = data.global_batch_indices(
        reader.manifest.train.count, config.training.global_batch, config.training.seed, message.iteration
    )
    x, y = reader.take("train", data.worker_indices(batch, config.workers, message.worker))
    started = time.perf_counter()
    update = trainer.compute_update(x, y)
    compute_s = time.perf_counter() - started
    body = updates.encode(update.vector, samples=len(x))
    finite = bool(np.isfinite(update.loss) and np.isfinite(update.vector).all())
    done = WorkDone(
        run_id=message.run_id,
        iteration=message.iteration,
        generation=message.generation,
        worker=message.worker,
        attempt=message.attempt,
        samples=len(x),
        loss=update.loss if finite else 0.0,
        accuracy=update.accuracy if finite else None,
        compute_s=compute_s,
        finite=finite,
    )
    metadata = {"done": json.dumps(done.model_dump(mode="json"))}
    if not finite:
        logger.warning("non-finite update", extra={"run_id": message.run_id, "iteration": message.iteration,
                                                   "worker": message.worker, "loss": repr(update.loss)})
    key = keys.update(message.run_id, message.iteration, message.worker, message.attempt)
    if not store.put_new(key, body, metadata=metadata):  # a duplicate or a retry: announce the stored update
        stored = WorkDone.model_validate_json(store.head(key)["done"])
        done = stored.model_copy(update={"generation": message.generation})  # a resumed run may announce it again
    return done
