"""What a TensorFlow function (Worker, Merger) keeps warm between invocations: one model per run,
one dataset reader per dataset."""

from __future__ import annotations

from slsml import data, keys, modelio
from slsml.config import RunConfig
from slsml.errors import BadInputError
from slsml.storage import ObjectStore

_trainers: dict[str, modelio.Trainer] = {}
_readers: dict[str, data.DatasetReader] = {}


def trainer_for(store: ObjectStore, config: RunConfig, iteration: int) -> tuple[modelio.Trainer, bool]:
    """The run's warm model, loaded from ``models/<iteration>.keras`` on a cold start.

    Returns (trainer, fresh): a fresh trainer already holds the weights entering ``iteration``.
    """
    trainer = _trainers.get(config.run_id)
    if trainer is not None:
        return trainer, False
    key = keys.model(config.run_id, iteration)
    model = modelio.load_model(store.get(key), where=key)
    if tuple(modelio.variable_specs(model)) != config.plan.variables:
        raise BadInputError(f"{key} does not have the weights of the model the run was started with")
    trainer = _trainers[config.run_id] = modelio.Trainer(model, config.plan, config.loss, config.classification)
    return trainer, True


def reader_for(store: ObjectStore, dataset: str) -> data.DatasetReader:
    reader = _readers.get(dataset)
    if reader is None:
        reader = _readers[dataset] = data.DatasetReader(store, data.load_manifest(store, dataset))
    return reader
