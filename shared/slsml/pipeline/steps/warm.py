"""What a TensorFlow function (Worker, Merger) keeps warm between invocations, in the process's warm
cache (``slsml.aws.cache``): one model per run (a Worker's: per architecture), one dataset reader (and its shards)
per dataset as runs pinned it."""

from __future__ import annotations

import hashlib
import io
import math
import zipfile

import keras
import numpy as np

from slsml.accounting import usage
from slsml.aws import cache
from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.pipeline import staged
from slsml.pipeline.steps.common import refused
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.spec.errors import BadInputError
from slsml.training import bounds, modelio

# A warm Trainer holds its model's variables (weights and, for a compiled model, the optimizer's slots)
# and a traced step. Measured, each Trainer more took 0.8-1.1× its variables' bytes of resident memory
# (dense models of 0.3 to 205 MB of variables, plain and compiled with Adam), and 1.4-3.2 MB for models
# under 1 MB (the demo's CNN: 2.0 MB): the estimate takes the high end.
TRAINER_OVERHEAD_FACTOR = 1.1
TRAINER_FIXED_BYTES = 3 * 2**20


# a stage function reads the model's archive this many bytes a GET: it holds no more of it at once
ARCHIVE_CHUNK = 16 * 2**20


def trainer_bytes(trainer: modelio.Trainer) -> int:
    """What a warm Trainer takes in memory (estimated from its variables that hold values)."""
    model = trainer.model
    optimizer = getattr(model, "optimizer", None)
    variables = [*model.weights, *(optimizer.variables if optimizer is not None else [])]
    variables = [v for v in variables if modelio.held(v)]
    held = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)
    return int(TRAINER_OVERHEAD_FACTOR * held) + TRAINER_FIXED_BYTES


def trainer_for(
    store: ObjectStore, config: RunConfig, iteration: int, shared: bool = False
) -> tuple[modelio.Trainer, bool]:
    """The run's warm model, loaded from the model the run was started with (``source.keras``) on a cold start
    (or once evicted). ``shared`` (a Worker's, which only computes with it): one warm model serves every run of the
    same architecture, loss and kind of labels, so that a run that finds one skips the model's download, build and
    tracing (a sweep's runs, a notebook's models built alike).

    Returns (trainer, fresh): a fresh trainer already holds the weights entering ``iteration`` (the first one's).
    """
    warm = cache.warm()
    key: tuple[str | bool | None, ...] = ("trainer", config.run_id)
    if shared and config.architecture is not None:
        key = ("trainer", config.architecture, config.loss, config.classification)
    trainer = warm.get(key)
    if trainer is not None:
        trainer.plan = config.plan  # the variables' names are the run's (the same shapes, in the same order)
        return trainer, False
    model_key = keys.source_model(config.run_id)
    with usage.warming():  # once per container (and architecture, or run)
        model = stored_model(store, model_key, config.source_sha256)
    if tuple(modelio.variable_specs(model)) != config.plan.variables:
        raise BadInputError(f"{model_key} does not have the weights of the model the run was started with")
    trainer = modelio.Trainer(model, config.plan, config.loss)
    return warm.put(key, trainer, trainer_bytes(trainer)), iteration == 0


def stage_trainer_for(store: ObjectStore, config: RunConfig, stage: int) -> modelio.Trainer:
    """The warm model of pipeline stage ``stage`` of the run (``RunConfig.stage_blocks``): the model the run was
    started with built from its config alone, its stage's layers' weights alone given memory (``modelio.hold``: set
    from the shards each round), so that a stage function holds its own weights, not the model's. On a cold start
    the archive's SHA-256 is checked against run.json's before its config is taken: the one S3 keeps of it, else
    one computed, the archive read ``ARCHIVE_CHUNK`` bytes at a time (``ObjectStore.opened``)."""
    assert config.stage_blocks is not None
    warm = cache.warm()
    key = (
        "stage",
        config.architecture or config.run_id,
        config.loss,
        config.classification,
        config.stage_blocks,
        stage,
    )
    trainer = warm.get(key)
    if trainer is not None:
        trainer.plan = config.plan
        return trainer
    model_key = keys.source_model(config.run_id)
    with usage.warming():  # once per container (and architecture, or run)
        digest, opened = store.opened(model_key, ARCHIVE_CHUNK, config.source_sha256)
        _check_sha256(model_key, digest, config.source_sha256)
        try:
            with zipfile.ZipFile(io.BufferedReader(opened, 2**16)) as archive:
                text = archive.read("config.json")
        except (zipfile.BadZipFile, KeyError) as error:
            raise BadInputError(f"{model_key} is not a Keras model: {error}") from None
        model = modelio.skeleton(text, model_key)
    if tuple(modelio.variable_specs(model)) != config.plan.variables:
        raise BadInputError(f"{model_key} does not have the weights of the model the run was started with")
    modelio.hold(model, staged.stage_models(model, config.stage_blocks)[stage].weights)
    trainer = modelio.Trainer(model, config.plan, config.loss)
    return warm.put(key, trainer, trainer_bytes(trainer))


def stored_model(store: ObjectStore, key: str, sha256: str | None = None) -> keras.Model:
    """The model at ``key``, read and built only if it fits this function (BadInputError naming the figures), and,
    where ``sha256`` names it, only if its bytes have that SHA-256 (``common.refused`` naming it if not)."""
    limits = bounds.Limits.here()
    body = store.get_bounded(key, limits.archive_bytes, limits.describe())
    _check_sha256(key, hashlib.sha256(body).hexdigest(), sha256)
    return modelio.load_model(body, where=key, limits=limits)


def _check_sha256(key: str, digest: str, sha256: str | None) -> None:
    """``common.refused`` where ``sha256`` names the model at ``key`` and its bytes as read (``digest``) are others."""
    if sha256 is not None and digest != sha256:
        raise refused(key, "is not the model run.json names (its SHA-256)")


def reader_for(store: ObjectStore, config: RunConfig) -> data.DatasetReader:
    """The reader of the run's dataset as the run pinned it (``RunConfig.dataset_sha256``: a manifest of other bytes
    fails the run, naming the dataset); its shards are entries of the warm cache too."""
    warm = cache.warm()
    key = ("reader", config.dataset, config.dataset_sha256)
    reader = warm.get(key)
    if reader is None:
        with usage.warming():  # once per container and dataset
            manifest = data.pinned_manifest(store, config.dataset, config.dataset_sha256)
        size = cache.PARSED_BYTES_PER_JSON_BYTE * len(manifest.model_dump_json())
        reader = warm.put(key, data.DatasetReader(store, manifest, warm), size)
    return reader
