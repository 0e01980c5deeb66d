"""Worker: compute the update of a round's batches with the run's update rule (``slsml.rules``) and
store it for the reducers, who read a part each. An update with NaN or Inf is stored and announced like any
other but marked non-finite, so that it is left out.
A run that compresses its updates (``compress``) adds the worker slot's residual to the update before it is
compressed and stores the new residual before the update (error feedback, ``slsml.training.feedback``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, overload

import numpy as np
from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit

from slsml import rules
from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.pipeline import metrics
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import load_weights, run_config
from slsml.pipeline.steps.warm import reader_for, trainer_for
from slsml.rules.base import Round
from slsml.spec import keys, wiring
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.errors import NotFoundError, RunFailed
from slsml.spec.messages import WorkDone, WorkMessage
from slsml.training import feedback, modelio, updates

logger = Logger(child=True)


def work(message: WorkMessage, services: Services) -> WorkDone:
    config = run_config(services.store, message.run_id)
    if message.worker >= message.workers:
        raise RunFailed(f"work message for worker {message.worker} of an iteration of {message.workers} workers")
    done = _compute(message, config, services)
    services.bus.publish(wiring.WORK_DONE, [done])
    metrics.emit(Metric.WORKER_COMPUTE_SECONDS, done.compute_s, MetricUnit.Seconds)
    if done.finite:  # a non-finite update is announced with no loss
        metrics.emit(Metric.TRAIN_LOSS, done.loss, MetricUnit.NoUnit)
    return done


class _Prefetched(Sequence[tuple[np.ndarray, np.ndarray]]):
    """The round's batches, read concurrently from the start: batch k waits for its own read alone, so that the
    batches after it are read while it computes."""

    def __init__(self, reads: list[Future[tuple[np.ndarray, np.ndarray]]]) -> None:
        self._reads = reads

    def __len__(self) -> int:
        return len(self._reads)

    @overload
    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[np.ndarray, np.ndarray]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [read.result() for read in self._reads[index]]
        return self._reads[index].result()


def _compute(message: WorkMessage, config: RunConfig, services: Services) -> WorkDone:
    store, spec = services.store, config.training
    reader = reader_for(store, config.dataset)
    count = reader.manifest.train.count
    batches = data.round_batches(spec, count, message.workers, message.worker, message.iteration,
                                 data.block_order(spec, count))
    with ThreadPoolExecutor(max_workers=len(batches), thread_name_prefix="batch") as reads:
        # the round's samples are read while the model and the weights are
        slices = _Prefetched([reads.submit(reader.take, "train", indices) for indices in batches])
        trainer, fresh = trainer_for(store, config, message.iteration, shared=True)
        if fresh:  # the weights entering the iteration, in the model and as one flat vector
            start = modelio.get_flat(trainer.model, config.plan)
        else:
            start = load_weights(store, config, message.iteration)
            modelio.set_flat(trainer.model, config.plan, start)
        return _train(message, config, services, trainer, start, slices, sum(len(b) for b in batches))


def _train(message: WorkMessage, config: RunConfig, services: Services, trainer: modelio.Trainer, start: np.ndarray,
           slices: Sequence[tuple[np.ndarray, np.ndarray]], samples: int) -> WorkDone:
    store, spec = services.store, config.training
    compression, rule = spec.compression, rules.of(spec)
    weights = start if compression.kind == "significance" else None
    with ThreadPoolExecutor(max_workers=1) as pool:  # the slot's residual is read while the update is computed
        residual = pool.submit(_residual, message, config, store) if compression.lossy else None
        slices[0]  # the first batch read: compute starts (the others are read meanwhile)
        started = time.perf_counter()
        update = rule.round(Round(trainer, start, slices, spec, _Slot(store, message)))
        compute_s = time.perf_counter() - started
        previous = residual.result() if residual is not None else None
    finite = bool(np.isfinite(update.loss) and np.isfinite(update.vector).all())
    if compression.lossy:  # error feedback: the residual is stored first, create-only (see slsml.training.feedback)
        compressed = feedback.compress(update.vector, previous, config.plan, compression, samples, rule.kind,
                                       weights)
        body, header = compressed.update
        store.put_new(keys.residual(message.run_id, message.iteration, message.worker),
                      feedback.encode_residual(compressed.residual))
    else:
        body, header = updates.encode(update.vector, samples=samples, kind=rule.kind)
    done = WorkDone(
        run_id=message.run_id,
        iteration=message.iteration,
        generation=message.generation,
        worker=message.worker,
        attempt=message.attempt,
        samples=samples,
        loss=update.loss if finite else 0.0,
        accuracy=update.accuracy if finite else None,
        compute_s=compute_s,
        finite=finite,
    )
    metadata = {"done": json.dumps(done.model_dump(mode="json")), **header}
    if not finite:
        logger.warning("non-finite update", extra={"run_id": message.run_id, "iteration": message.iteration,
                                                   "worker": message.worker, "loss": repr(update.loss)})
    key = keys.update(message.run_id, message.iteration, message.worker, message.attempt)
    if not store.put_new(key, body, metadata=metadata):  # a duplicate or a retry: announce the stored update
        stored = WorkDone.model_validate_json((store.head(key) or {})["done"])
        done = stored.model_copy(update={"generation": message.generation})  # a resumed run may announce it again
    return done


def _residual(message: WorkMessage, config: RunConfig, store: ObjectStore) -> np.ndarray | None:
    """What compression left out of this worker slot's updates up to the iteration before (None: nothing)."""
    if message.iteration == 0:
        return None
    key = keys.residual(message.run_id, message.iteration - 1, message.worker)
    try:
        body = store.get(key)
    except NotFoundError:
        logger.info("no residual of the iteration before: starting from zeros",
                    extra={"run_id": message.run_id, "iteration": message.iteration, "worker": message.worker})
        return None
    try:
        return feedback.decode_residual(body, config.plan, key)
    except feedback.ResidualError as error:
        raise RunFailed(str(error)) from None


class _Slot:
    """The worker slot's state objects (``keys.local_state``), for the run's update rule."""

    def __init__(self, store: ObjectStore, message: WorkMessage) -> None:
        self.store, self.message = store, message

    def where(self, previous: bool = False) -> str:
        message = self.message
        return keys.local_state(message.run_id, message.iteration - previous, message.worker)

    def previous(self) -> bytes | None:
        if self.message.iteration == 0:
            return None
        body = self._get(self.where(previous=True))
        if body is None:
            logger.info("no slot state of the round before: starting fresh", extra={
                "run_id": self.message.run_id, "iteration": self.message.iteration, "worker": self.message.worker})
        return body

    def put(self, body: bytes) -> bool:
        return self.store.put_new(self.where(), body)

    def current(self) -> bytes | None:
        return self._get(self.where())

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except NotFoundError:
            return None
