"""Merger: when every shard of an iteration is in, store the next iteration's manifest (``models/<i>.json``,
naming the shards' ETags; under ASP that of the model version as many iterations on as the reduce applied updates:
``barrier.next_version``) and launch it (``ModelMerged`` to the WorkLauncher, sent again by a retry): the workers
read the weights from the shards themselves (``steps.common.load_weights``), so that no merged copy of the model lies
on an iteration's path. The model is assembled and saved (``models/<i>.keras``) only where the run may end on it,
before its manifest (the final model, which also carries the optimizer's state, as ``fit`` leaves it, for gradient
averaging, whose reducers step the run's optimizer as Keras would), and at each checkpoint (``checkpoint_every``),
after it.

Once the run has advanced, the carried state entering the iteration before (``keys.carried``) is superseded: the
run resumes from the newest model, whose state is stored, and a step still needing the older state is one
iteration late at least. The Merger deletes it (one DeleteObjects request) while the manifest is made; under ASP
(``staleness unbounded``) it keeps it, as a worker reads the version it was launched on whenever it starts, and the
bucket's lifecycle rule expires it with the run's other scratch; under ``stale_weights`` it deletes the state entering
the iteration before that one, which a round launched ahead reads too.

The merging Merger also turns the iteration's train metrics, the sum of its participants' states that the
reduce's firing recorded on the counter, into their results (``loss`` and each metric by its Keras name), once, and
records them with its claim of the merge.

Under ``stale_weights`` the next iteration's workers were launched as this one's reduce fired: once the model is
stored, the Merger fires their reduce if it was held for it (``reduce_launcher.fire_held``)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit

from slsml import rules
from slsml.aws.storage import ObjectStore
from slsml.pipeline import metrics
from slsml.pipeline.proof import OBJECT_PROOF
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import carried_state, run_config, shard_etags
from slsml.pipeline.steps.reduce_launcher import apply_next, fire_held
from slsml.pipeline.steps.warm import reader_for, stored_model, trainer_for
from slsml.rounds.evaluation import evaluated, evaluator_for
from slsml.spec import keys, wiring
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.errors import BadInputError
from slsml.spec.messages import Manifest, ModelMerged, ReduceDone
from slsml.state.barrier import next_version
from slsml.state.records import MERGER_OWNER, RunRecord
from slsml.training import modelio, shards
from slsml.training.modelio import Trainer
from slsml.training.optimizers import State

logger = Logger(child=True)
MERGED_METADATA = "merged-from"  # on a model the Merger stored: the iteration whose shards it assembled
GENERATION_METADATA = "generation"  # and the run's generation that assembled them
HEARTBEATS_PER_WINDOW = 4  # the run's execution hears from the pipeline this often within its heartbeat window


def on_reduce_done(message: ReduceDone, services: Services) -> str | None:
    """Count the shard; returns the key of the next iteration's manifest if this message completed the iteration."""
    store, table = services.store, services.table
    config = run_config(services, message.run_id)
    run, iteration = message.run_id, message.iteration
    counter = table.record_shard(run, iteration, message.generation)
    if counter is None or counter.shards_in < config.reducers or counter.merge_fired_by not in {None, message.shard}:
        return None
    following = next_version(iteration, message.updates, config.training.asynchronous)
    next_key = keys.manifest(run, following)
    if counter.merged_at is not None and store.exists(next_key):  # a copy of the message that merged
        _announce(services, message, following)  # its announcement may be what failed
        if config.training.asynchronous:  # or its reduce of the updates waiting (a copy of one sent goes once)
            apply_next(services, config, message.generation, MERGER_OWNER)
        return None
    etags = shard_etags(store, config, following)  # the count is a hint (a duplicate counts twice)
    if etags is None:
        return None
    train = _train_figures(store, config, iteration, counter.train_state)
    if not table.fire_merge(run, iteration, message.shard, message.generation, train):
        return None
    ends = _may_end(store, config, following)  # the model a run may end on is saved before it is launched
    with ThreadPoolExecutor(max_workers=1) as pool:  # the run advances while the model is assembled
        advancing = pool.submit(table.advance, run, following, message.generation)
        fitted = ends and rules.of(config.training).fit_state
        assembled = _assembled(store, config, iteration, following, fitted) if ends else None
        advanced = advancing.result()
    # stored after the advance: its digest is recorded first, and the table is not written from two threads
    saved = None if assembled is None else _store_model(services, config, following, *assembled)
    if advanced is None:  # stopped, failed or resumed meanwhile
        return None
    body = Manifest(iteration=following, shards=etags, model_sha256=saved).model_dump_json().encode()
    metadata = {
        MERGED_METADATA: str(iteration),
        GENERATION_METADATA: str(message.generation),
        **services.keys.sign_object(run, next_key, body),  # its readers take it only as the Merger stored it
    }
    stored = store.put_new(next_key, body, metadata) or _adopt(store, next_key, body, metadata)
    behind = iteration - 1 - config.training.stale_weights  # (a round one ahead reads the state before its own)
    if behind >= 0 and not config.training.asynchronous:  # after the advance: a step that finds it gone is late
        store.delete(carried_state(config, behind))
    _announce(services, message, following)
    if config.training.asynchronous:  # ASP: the updates that came while this version was reduced: to the next
        apply_next(services, config, message.generation, MERGER_OWNER, advanced)
    if config.training.stale_weights:  # the next iteration's reduce, held for this model, may fire
        fire_held(services, config, following, message.generation)
    if not stored:
        return None  # merged before: a retry
    _heartbeat(services, advanced)
    if counter.launched_at is not None:  # since the iteration was launched
        metrics.emit(Metric.ITERATION_SECONDS, time.time() - counter.launched_at, MetricUnit.Seconds)
    logger.info("model merged", extra={"run_id": run, "iteration": following})
    every = config.training.checkpoint_every
    # a checkpoint, on a multiple of it (ASP: the first version at or past one), saved once the next iteration runs
    if not ends and every and following // every > iteration // every:
        _save(services, config, iteration, following, fitted=False)
    return next_key


def _announce(services: Services, merged: ReduceDone, following: int) -> None:
    """Tell the WorkLauncher that the manifest of the model version ``following`` ``merged``'s is stored (a
    repeated message launches nothing twice: the launch is claimed once per manifest and generation)."""
    services.bus.publish(
        wiring.MODEL_UPDATED,
        [ModelMerged(run_id=merged.run_id, iteration=following, generation=merged.generation)],
    )


def _train_figures(
    store: ObjectStore, config: RunConfig, iteration: int, state: list[float] | None
) -> dict[str, float] | None:
    """The loss and metrics over ``iteration``'s batches from the sum of its participants' states (None: none
    recorded); NaN and Inf as the sum gives them, as Keras shows them (NaN for some metrics of too few samples)."""
    if state is None:
        return None
    trainer, _ = trainer_for(store, config, iteration)
    reader = reader_for(store, config)
    evaluator = evaluator_for(
        trainer, config, lambda: reader.take("test", np.arange(min(2, reader.manifest.test.count)))
    )
    try:
        figures = evaluator.result([np.asarray(state, dtype=np.float64)])
    except ValueError as error:
        logger.warning(
            "train metrics left out", extra={"run_id": config.run_id, "iteration": iteration, "why": str(error)}
        )
        return None
    return figures


def _may_end(store: ObjectStore, config: RunConfig, iteration: int) -> bool:
    """Whether the run may end on the model entering ``iteration``: the final one, and each one a run that
    watches a split (``early_stopping``, ``keep_best``) evaluates that split on."""
    if iteration == config.training.iterations:
        return True
    watched = {monitor.split("_", 1)[0] for monitor in config.training.monitors}
    return bool(watched) and bool(
        watched & set(evaluated(config, iteration, reader_for(store, config).manifest.train.count))
    )


def _save(services: Services, config: RunConfig, iteration: int, following: int, fitted: bool) -> str:
    """Store the model version ``following`` (that ``iteration``'s reduce made) as ``models/<following>.keras``,
    assembled from its shards (``fitted``: with its optimizer's state, as ``fit`` leaves it); returns its SHA-256
    (``_store_model``)."""
    return _store_model(services, config, following, *_assembled(services.store, config, iteration, following, fitted))


def _assembled(
    store: ObjectStore, config: RunConfig, iteration: int, following: int, fitted: bool
) -> tuple[bytes, np.ndarray]:
    """``_save``'s model as saved, and its flat weights."""
    parts = store.get_many(
        [keys.shard(config.run_id, following, r) for r in range(config.reducers)],
        [shards.weights_range(config.plan, r) for r in range(config.reducers)],
    )
    weights = np.concatenate([shards.decode_weights(part, config.plan, r) for r, part in enumerate(parts)])
    trainer, _ = trainer_for(store, config, iteration)
    modelio.set_flat(trainer.model, config.plan, weights)
    return (_fitted(store, config, following, trainer, parts) if fitted else trainer.save()), weights


def _store_model(services: Services, config: RunConfig, following: int, body: bytes, weights: np.ndarray) -> str:
    """Store ``body`` (of ``weights``) as the model entering ``following``, its SHA-256 recorded in the run's table
    first, which its readers check it by (``client.runs.saved_model``: one read before it is stored finds none there
    yet); returns the digest. One stored before with these weights (by a retry) is kept, its digest recorded; an
    object of other weights at the key is not the Merger's (a forged or pre-placed one): it is replaced."""
    store, key = services.store, keys.model(config.run_id, following)
    digest = hashlib.sha256(body).hexdigest()
    if not store.exists(key):
        services.table.record_saved(config.run_id, following, digest)
        if store.put_new(key, body):
            return digest
    if _holds(store, config, key, weights):  # stored before (a retry, or a copy of this merge meanwhile)
        digest = hashlib.sha256(store.get(key)).hexdigest()
        services.table.record_saved(config.run_id, following, digest)
        return digest
    logger.warning("an object not stored by the Merger was replaced", extra={"key": key})
    services.table.record_saved(config.run_id, following, digest)
    store.replace(key, body)
    return digest


def _fitted(store: ObjectStore, config: RunConfig, following: int, trainer: Trainer, parts: list[bytes]) -> bytes:
    """The trainer's model (holding the merged weights) as ``fit`` leaves it, its optimizer holding the reducers'
    state: each shard's state archive read by range, one at a time (``parts``: the reads of their weights, whose
    headers also carry the loss scale the run ended with, where it scaled its loss dynamically)."""

    def states() -> Iterator[State]:
        for shard, part in enumerate(parts):
            where = keys.shard(config.run_id, following, shard)
            yield shards.decode_state(store.get(where, shards.state_range(part, config.plan, shard)))

    return modelio.fitted_model(
        trainer.model, config.optimizer, config.loss, config.metrics, config.plan, states(), shards.loss_scale(parts[0])
    )


def _adopt(store: ObjectStore, key: str, body: bytes, metadata: dict[str, str]) -> bool:
    """The manifest at ``key`` was stored before. False if this generation's Merger stored it (a retry). True if it
    is stored anew as this generation's, and the next iteration is launched from it: a manifest an earlier
    generation stored (a resumed run merged again an iteration the earlier one had finished, whose manifest landed
    while the run was at an iteration before, so that its event launched nothing) is stored again in place; an
    object that names other shards than the merged ones, or does not carry the Merger's proof of origin, is not this
    run's (a forged or pre-placed one, whatever else its metadata says): it is replaced."""
    stored = store.read(key)
    if stored.body != body or any(
        stored.metadata.get(name) != metadata[name] for name in (MERGED_METADATA, OBJECT_PROOF)
    ):
        logger.warning("an object not stored by the Merger was replaced", extra={"key": key})
        store.replace(key, body, metadata)
        return True
    if int(stored.metadata.get(GENERATION_METADATA, 0)) >= int(metadata[GENERATION_METADATA]):
        return False
    store.restamp(key, metadata)
    return True


def _holds(store: ObjectStore, config: RunConfig, key: str, weights: np.ndarray) -> bool:
    """Whether the model at ``key`` is the run's model with ``weights``."""
    try:
        model = stored_model(store, key)
        return config.architecture in {None, modelio.architecture(model)} and np.array_equal(
            modelio.get_flat(model, config.plan), weights
        )
    except (BadInputError, ValueError):
        return False


def _heartbeat(services: Services, run: RunRecord) -> None:
    """Tell the run's execution the pipeline lives, a few times per heartbeat window (not every iteration)."""
    due = run.heartbeat_at is None or time.time() - run.heartbeat_at > run.heartbeat_s / HEARTBEATS_PER_WINDOW
    if run.task_token and due:
        services.orchestrator.heartbeat(run.task_token)
        services.table.mark_heartbeat(run.run_id)
