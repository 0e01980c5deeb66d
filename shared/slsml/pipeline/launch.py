"""Starting a run, as a user's command and the RunStarter function (a model dropped under ``incoming/``) start it:
the run's model and data checked, its length, class weights and monitored figures resolved, its config, initial weights
and source model stored (``prepare_run``), then its execution of the run state machine started (``launch_run``)."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime
from typing import Literal

import numpy as np

from slsml import rules
from slsml.aws import cache
from slsml.aws.storage import stored_etag
from slsml.cost import budget
from slsml.cost.messages import check_messages
from slsml.data import datasets as data
from slsml.data.manifest import DatasetManifest
from slsml.pipeline import staged
from slsml.pipeline.services import Services
from slsml.rounds import sizing
from slsml.spec import keys, samples
from slsml.spec.config import RunConfig, TrainingSpec, config_digest
from slsml.spec.errors import BadInputError, NotFoundError, SlsmlError
from slsml.spec.shardplan import ShardPlan
from slsml.state.orchestration import ExecutionInput
from slsml.training import optimizers, shards, weighting

MERGE_PROBE = 64  # training samples a run's metrics are evaluated on, whole and in parts, before it starts


def new_run_id(stem: str = "run") -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stem}-{stamp}-{secrets.token_hex(2)}"


def start_run(
    services: Services,
    model_bytes: bytes,
    dataset: str,
    spec: TrainingSpec,
    run_id: str | None = None,
    check_limits: bool = True,
) -> RunConfig:
    """Prepare a run, then start its execution of the run state machine, which registers it and
    places its model at ``models/000000.keras``: the upload that starts the pipeline."""
    config = prepare_run(services, model_bytes, dataset, spec, run_id, check_limits)
    launch_run(services, config)
    return config


def launch_run(services: Services, config: RunConfig, stored: bytes | None = None) -> None:
    """Start the execution of a prepared run (its run.json: ``stored``, default ``config.stored()``, the digest of
    which it registers); returns once the run is registered."""
    execution = services.orchestrator.start(execution_input(config, config_digest(stored or config.stored())))
    wait_until_registered(services, config.run_id, execution)


def execution_input(
    config: RunConfig, digest: str, resume: bool = False, training: TrainingSpec | None = None
) -> ExecutionInput:
    return ExecutionInput(
        run_id=config.run_id,
        dataset=config.dataset,
        training=training or config.training,
        workers=config.workers,
        created_at=time.time(),
        resume=resume,
        config_sha256=digest,
    )


def wait_until_registered(services: Services, run_id: str, execution: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            services.table.get_run(run_id)
            return
        except NotFoundError:
            status, cause = services.orchestrator.describe(execution)
            if status != "RUNNING":
                raise SlsmlError(f"run {run_id!r} was not registered: its execution {status}: {cause}") from None
            if time.monotonic() > deadline:
                raise SlsmlError(f"run {run_id!r} was not registered within {timeout_s:.0f} s") from None
        time.sleep(0.05)


def prepare_run(
    services: Services,
    model_bytes: bytes,
    dataset: str,
    spec: TrainingSpec,
    run_id: str | None = None,
    check_limits: bool = True,
) -> RunConfig:
    """Validate model and data, and the plan's prediction against the run's budget if it has one, then write the
    run's config, initial weights and ``source.keras``. Bad input (or a run predicted above its budget) raises
    BadInputError before anything is written, as does a run beyond the deployment's limits (unless not
    ``check_limits``: the pipeline then FAILS the run with the reason, as it does whatever started it)."""
    from slsml.training import evaluation, modelio, stages  # TensorFlow: only where a model is read

    run_id = run_id or new_run_id()
    store = services.store
    manifest, pinned = data.open_manifest(store, dataset)  # the run pins the dataset as it is now
    model = modelio.load_model(model_bytes, where="the model")
    rules.of(spec).check_model(model)
    modelio.check_policy(model, spec.mixed_precision)
    modelio.check_compiled(model, loss=spec.loss is not None, optimizer=spec.optimizer is not None)
    if spec.pipeline_stages > 1 and (why := stages.refusal(model, spec.pipeline_stages)) is not None:
        raise BadInputError(why)  # before the data is read: the model alone rules the stages out
    loss = modelio.loss_config(model, spec.loss)
    optimizer = spec.optimizer or modelio.optimizer_config(model)
    spec = with_epochs(spec, manifest.train.count)
    check_messages(spec)
    if check_limits and (refusal := services.limits.refusal(spec)):
        raise BadInputError(refusal)
    x, y = data.DatasetReader(store, manifest).take("train", np.arange(min(MERGE_PROBE, manifest.train.count)))
    ranges = {a.name: a.range for a in manifest.x_arrays} if manifest.x_arrays is not None else manifest.x_range
    modelio.check_fits(model, loss, x, y, manifest.classes, ranges)
    classification = manifest.classes is not None or modelio.classifies(loss)
    metrics = modelio.metrics_config(model, classification)
    evaluation.check_mergeable(model, loss, metrics, x, y)
    plan = ShardPlan.build(modelio.variable_specs(model), spec.reducers)
    class_weights = _class_weights(spec, manifest)
    sample = samples.take(x, slice(2)), samples.take(y, slice(2))
    modes = _modes(spec, evaluation.figure_modes(model, loss, metrics, sample)) if spec.monitors else {}
    budget.check(model_bytes, manifest, spec, services.limits)  # last: it times a gradient step
    config = RunConfig(
        run_id=run_id,
        dataset=dataset,
        dataset_sha256=pinned,
        training=spec,
        optimizer=optimizer,
        loss=loss,
        classification=classification,
        metrics=metrics,
        class_weights=class_weights,
        modes=modes,
        plan=plan,
        sample_bytes=sizing.sample_bytes(model),
        architecture=modelio.architecture(model),
    )
    config = with_compress_warmup(config, manifest.train.count)
    if spec.pipeline_stages > 1:  # split where the stages' compute is most even, each stage's step fitting a worker
        config = staged.configured(config, model, services.limits.worker_memory_mb)
    elif refusal := memory_refusal(config, services.limits.worker_memory_mb):
        raise BadInputError(refusal)
    flat = modelio.get_flat(model, plan)
    initial = {}  # the shards entering iteration 0, which run.json names by their ETags
    for shard in range(plan.reducers):
        layout = plan.shard(shard)
        state = optimizers.initial_state(rules.server_optimizer(config), int(layout.trainable.sum()))
        initial[keys.shard(run_id, 0, shard)] = shards.encode(shards.Shard(flat[layout.start : layout.stop], state, []))
    named = {
        "initial_shards": [stored_etag(key, body) for key, body in initial.items()],
        "source_sha256": hashlib.sha256(model_bytes).hexdigest(),
    }
    config = config.model_copy(update=named)
    if not store.put_new(keys.run_config(run_id), config.stored()):
        raise BadInputError(
            f"a run named {run_id!r} already exists (`slsml run status {run_id}` shows it): give this one another"
            " run id, or none for a fresh one"
        )
    for key, body in initial.items():
        store.put_new(key, body)
    store.put_new(keys.source_model(run_id), model_bytes)
    return config


def memory_refusal(config: RunConfig, worker_memory_mb: int) -> str | None:
    """Why the run's steps cannot fit a worker of ``worker_memory_mb``: not one sample fits, or the micro-batch it
    asks for (``--micro-batch``) does not (None: they fit)."""
    memory = sizing.of_run(config, worker_memory_mb, cache.MEMORY_SHARE * worker_memory_mb, rules.slot_bytes(config))
    if (refusal := memory.refusal()) is not None:
        return refusal
    asked, fitting = config.training.micro_batch, memory.micro_batch()
    if asked is not None and asked > fitting:
        return (
            f"--micro-batch {asked}: a step of {asked} samples needs ~{memory.needed_mb(asked, 2):,.0f} MB and the"
            f" worker has {worker_memory_mb:,} MB; {fitting:,} fit (leave --micro-batch out to compute in those)"
        )
    return None


def _modes(spec: TrainingSpec, figures: dict[str, str | None]) -> dict[str, Literal["min", "max"]]:
    """Whether each monitored figure improves by falling or rising; BadInputError naming a figure the model does not
    compute, or one whose direction Keras cannot tell."""
    modes: dict[str, Literal["min", "max"]] = {}
    flags = {
        **({spec.stopping[0]: "--early-stopping"} if spec.stopping else {}),
        **({spec.keep_best: "--keep-best"} if spec.keep_best else {}),
    }
    for monitor, flag in flags.items():
        split, name = monitor.split("_", 1)
        if name not in figures:
            computed = ", ".join(f"{split}_{figure}" for figure in figures)
            raise BadInputError(f"{flag} {monitor}: the model does not compute {name!r} (it computes {computed})")
        mode = figures[name]
        if mode is None:
            raise BadInputError(f"{flag} {monitor}: Keras cannot tell whether {name} should fall or rise")
        modes[name] = "min" if mode == "min" else "max"
    return modes


def _class_weights(spec: TrainingSpec, manifest: DatasetManifest) -> tuple[float, ...] | None:
    """The run's weight of each class id (``class_weight`` resolved against the training labels); BadInputError
    naming a class the labels do not have."""
    if spec.class_weights is None:
        return None
    if manifest.weighted:
        raise BadInputError(
            f"dataset {manifest.name!r} holds sample weights and the run gives class_weight: Keras's"
            " fit takes one or the other (fold the class weights into the sample weights)"
        )
    if manifest.y_arrays is not None:
        raise BadInputError(
            f"dataset {manifest.name!r} has the labels of several outputs and the run gives class_weight: Keras's fit"
            " weighs the classes of a model of one output (give the samples' weights instead)"
        )
    y_shape = manifest.y_shape or ()
    one_hot = y_shape[-1] if len(y_shape) == 1 and y_shape[0] > 1 else None
    try:
        return weighting.resolve(spec.class_weights, manifest.class_counts, manifest.classes or one_hot)
    except ValueError as error:
        raise BadInputError(str(error)) from None


def with_epochs(spec: TrainingSpec, train_count: int) -> TrainingSpec:
    """``spec`` with its length in iterations: ``epochs`` × the iterations of an epoch of the samples it trains on
    (its own ``iterations`` without epochs). BadInputError if the samples do not make one global batch."""
    per_epoch = data.epoch_iterations(spec, train_count)  # refuses samples that do not make one global batch
    if spec.epochs is None:
        return spec
    return spec.model_copy(update={"iterations": spec.epochs * per_epoch})


def with_compress_warmup(config: RunConfig, train_count: int) -> RunConfig:
    """``config`` with its warm-up in iterations (``compress_warmup``): where not given, one epoch where a sparse
    compression feeds the reducers' adaptive optimizer, else none."""
    spec = config.training
    if spec.compress_warmup is not None or not spec.compression.sparse:
        return config
    adaptive = optimizers.adaptive(rules.server_optimizer(config))
    warmup = data.epoch_iterations(spec, train_count) if adaptive else 0
    return config.model_copy(update={"training": spec.model_copy(update={"compress_warmup": warmup})})
