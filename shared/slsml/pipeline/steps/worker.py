"""Worker: compute the update of a round's batches with the run's update rule (``slsml.rules``) and
store it for the reducers, who read a part each; its report (WorkDone) carries the state of the loss and compiled
metrics over the batches, on the forward passes that gave their gradients, as ``fit`` tracks them. An update with NaN or
Inf is stored and announced like any other but marked non-finite, so that it is left out; under loss scaling it is
announced as finite, its metadata saying it is not, and every shard skips the step (``slsml.training.precision``).
A run that compresses its updates lossily (``compress`` fp16, topk, significance) adds the worker slot's residual to
the update before it is compressed and stores the new residual before the update (error feedback,
``slsml.training.feedback``); ``sparse`` sends the update's nonzero entries, exactly, and keeps no residual.
The round itself lives in ``slsml.rounds`` and the run's rule: its micro-batches (sized to the function's memory), read
ahead of compute, added up; a round whose invocation's time runs short is handed on between micro-batches to a fresh
invocation of the same attempt (``slsml.training.progress``)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, replace
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import MetricUnit

from slsml import rules
from slsml.accounting import usage
from slsml.aws import cache
from slsml.data import datasets as data
from slsml.pipeline import lifetime, metrics, signed, staged
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import load_weights, named_shard, run_config, stop_reason
from slsml.pipeline.steps.warm import reader_for, stage_trainer_for, trainer_for
from slsml.rounds import accumulate, ahead, sizing, stream
from slsml.rounds import evaluation as evaluating
from slsml.rounds.evaluation import SLICE_EVALUATED, SLICE_KEY, SliceEvaluated, evaluated, evaluator_for
from slsml.rules.base import Round, UpdateRule
from slsml.spec import keys, wiring
from slsml.spec import samples as samples_
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.config import RunConfig
from slsml.spec.deployment import Metric
from slsml.spec.errors import BadInputError, NotFoundError, RunFailed
from slsml.spec.messages import WorkDone, WorkMessage
from slsml.state.records import RunStatus
from slsml.training import (
    bounds,
    evaluation,
    feedback,
    modelio,
    npz,
    precision,
    progress,
    shards,
    updates,
    weighting,
)
from slsml.training.generators import Draws
from slsml.training.precision import LossScale
from slsml.training.weighting import Batch

logger = Logger(child=True)
END_WAIT_S = 30.0  # how long the worker that asked the watchdog to end a run waits for it, before it trains on
END_POLL_S = 0.2
HAND_ON_S = 60.0  # a round handed on: its message's delivery and the fresh invocation's start, at most


def work(message: WorkMessage, services: Services) -> WorkDone | None:
    """Compute the update of the worker's slice, evaluating the model entering the iteration first when it is due;
    past the budget, only evaluate the final model (None: nothing to announce, as when the evaluation ended the
    run)."""
    finish = _round(message, services)
    return None if finish is None else _announced(finish(), services)


def step(message: WorkMessage, services: Services) -> Future[WorkDone] | WorkDone | None:
    """``work`` as the Worker's invocations run it: under ``stale_weights``, a round's update is stored and announced
    while the invocation goes on to the worker's next round (``going_on``), which waits for it only as it ends
    (``_stored``); else as ``work``. The report of the round before is in once a round has computed."""
    try:
        finish = _round(message, services)
    finally:
        _stored()
    if finish is None:
        return None
    if not run_config(services, message.run_id).training.stale_weights or message.resume:
        return _announced(finish(), services)  # (a continuation is handled once: its update is in as it ends)
    global _storing
    storing = _background().submit(lambda: _announced(finish(), services))
    _storing = lifetime.current(), storing
    return storing


def _round(message: WorkMessage, services: Services) -> Callable[[], WorkDone] | None:
    """The round of ``message`` computed (or the final model evaluated: None), and what stores and announces its
    update."""
    config = run_config(services, message.run_id)
    if message.worker >= message.workers:
        raise RunFailed(f"work message for worker {message.worker} of an iteration of {message.workers} workers")
    if message.pipeline_stage:  # a later stage of a round in stages: it hands on what it computes, and announces none
        _later_stage(message, config, services)
        return None
    if message.iteration >= config.training.iterations:
        trainer, _ = _entering(services, config, message.generation, message.iteration)
        count = reader_for(services.store, config).manifest.train.count
        _evaluate(message, config, services, trainer, evaluated(config, message.iteration, count))
        return None
    global _round_started
    _round_started = time.monotonic()
    return _compute(message, config, services)


def _announced(done: WorkDone, services: Services) -> WorkDone:
    """``done``, its update stored, published, with its metrics."""
    services.bus.publish(wiring.WORK_DONE, [done])
    metrics.emit(Metric.WORKER_COMPUTE_SECONDS, done.compute_s, MetricUnit.Seconds)
    if done.finite:  # a non-finite update is announced with no loss
        metrics.emit(Metric.TRAIN_LOSS, done.loss, MetricUnit.NoUnit)
    return done


_round_started = 0.0  # when the invocation's latest round began (time.monotonic)
# a round's update being stored and announced as the next round computes, and the invocation that computed it
_storing: tuple[object | None, Future[WorkDone]] | None = None


@functools.cache
def _background() -> ThreadPoolExecutor:
    """The thread that stores and announces a round's update while the invocation goes on."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="storing")


def _stored() -> None:
    """Wait until the update of the round before is stored and announced: its failure raised here, or, where an
    earlier invocation that failed left it (its message is retried), logged."""
    global _storing
    storing, _storing = _storing, None
    if storing is None:
        return
    invocation, stored = storing
    if invocation is lifetime.current():
        stored.result()
    elif (error := stored.exception()) is not None:
        logger.warning("an earlier invocation's update was not stored", extra={"error": repr(error)})


def going_on(message: WorkMessage, done: Future[WorkDone] | WorkDone | None, services: Services) -> WorkMessage | None:
    """``stale_weights``: the worker's round of the next iteration, taken to compute in this invocation
    (``RunTable.go_on``) as soon as ``message``'s round has computed (``done``: its report, stored and announced
    meanwhile), once the model the next round enters (the one entering this round's: ``_ahead`` reads it as this
    round computes) is merged, within a round's time, unless that iteration's launch sent it to a fresh invocation
    already; so that its GPU computes while the update is stored and the reduce it waited for runs. None: the
    invocation ends, the report in (the model is not merged within a round's time, another round's time is not
    left, the run ended or moved on, the next iteration is the evaluation's or past the budget, or the workers are
    tuned)."""
    following = _following(message, done, services)
    if following is None:
        _forget_next_reads()
        _stored()
    return following


def _following(
    message: WorkMessage, done: Future[WorkDone] | WorkDone | None, services: Services
) -> WorkMessage | None:
    config = run_config(services, message.run_id)
    following = message.iteration + 1
    if done is None or not _goes_on(config, following, services):
        return None
    round_s = time.monotonic() - _round_started
    entered, waited_until = keys.trigger(message.run_id, message.iteration), time.monotonic() + round_s
    while not services.store.exists(entered):  # the reduce of the round before is not merged yet: waited for as
        # long as a round takes at most (a round launched by the fire starts no later)
        if time.monotonic() > waited_until or lifetime.remaining_s() < ahead.GO_ON_ROUNDS * round_s + ahead.POLL_S:
            return None
        time.sleep(ahead.POLL_S)
    run = services.table.get_run(message.run_id)
    if lifetime.remaining_s() < ahead.GO_ON_ROUNDS * round_s or run.status != RunStatus.RUNNING:
        return None
    if run.generation != message.generation or not services.table.go_on(
        message.run_id, following, message.worker, message.generation
    ):
        return None
    logger.info(
        "round goes on in this invocation",
        extra={"run_id": message.run_id, "iteration": following, "worker": message.worker},
    )
    return message.model_copy(update={"iteration": following, "attempt": 0, "resume": 0, "ahead": True})


def _goes_on(config: RunConfig, following: int, services: Services) -> bool:
    """Whether a worker's invocation may go on to its round of iteration ``following``: under ``stale_weights``,
    with workers not tuned, one before the budget whose workers evaluate no model (launched by its merge, after the
    model entering it is evaluated)."""
    spec = config.training
    if not spec.stale_weights or spec.workers == "auto" or following >= spec.iterations:
        return False
    return not evaluated(config, following, reader_for(services.store, config).manifest.train.count)


def _entering(
    services: Services, config: RunConfig, generation: int, iteration: int, predicted: bool = False
) -> tuple[modelio.Trainer, np.ndarray]:
    """The warm model at the weights entering ``iteration``, and those weights as one flat vector (a fresh model
    holds them already: the first iteration's), read or found warm (``ahead.weights``). ``predicted`` (a round one
    ahead of ``iteration``, ``stale_weights``): the trainable weights entering the round are predicted from the last
    two models, w + (w − w_before), the step the round before took taken once more, so that the round's gradient is
    of about the weights its reduce steps."""
    trainer, fresh = trainer_for(services.store, config, iteration, shared=True)
    trainer.use_policy(config.training.mixed_precision)
    if fresh:
        return trainer, modelio.get_flat(trainer.model, config.plan)
    weights = _weights(services, config, generation, iteration)
    if predicted and iteration:  # (the initial model has none before it)
        mask = config.plan.trainable_mask()
        weights[mask] += weights[mask] - _weights(services, config, generation, iteration - 1)[mask]
    modelio.set_flat(trainer.model, config.plan, weights)
    return trainer, weights


def _weights(services: Services, config: RunConfig, generation: int, iteration: int) -> np.ndarray:
    """The weights entering ``iteration``, warm or read now (``slsml.rounds.ahead``)."""
    read = functools.partial(load_weights, services.store, config, iteration, services.keys)
    return ahead.weights(_model(config, generation, iteration), read, keep=bool(config.training.stale_weights))


def _model(config: RunConfig, generation: int, iteration: int) -> tuple[str, str, int, int]:
    """The warm cache's key of the weights entering ``iteration`` of the run's ``generation``."""
    return ("weights", config.run_id, generation, iteration)


def _ahead(services: Services, config: RunConfig, message: WorkMessage) -> ahead.Ahead:
    """The read of the model the worker's next round enters, once merged: a round launched ahead's (``stale_weights``)
    next round enters the model its reduce steps to (``slsml.rounds.ahead``)."""
    iteration, store = message.iteration, services.store
    return ahead.Ahead(
        _model(config, message.generation, iteration),
        functools.partial(store.exists, keys.manifest(config.run_id, iteration)),
        functools.partial(load_weights, store, config, iteration, services.keys),
        wanted=bool(config.training.stale_weights and message.ahead),
    )


def _compute(message: WorkMessage, config: RunConfig, services: Services) -> Callable[[], WorkDone] | None:
    store = services.store
    reader = reader_for(store, config)
    count = reader.manifest.train.count
    batches = _batches(message, config, services)
    resumed = _resumed(message, config, services)
    left = batches[resumed.steps :] if resumed is not None else batches  # a continuation reads the batches left
    micro = _micro_batch(config, services.limits.worker_accelerator_gib)
    skip = resumed.micro_batches if resumed is not None else 0
    if config.stage_blocks is not None:  # stage 0 of a round in stages
        (batch,) = batches
        skip = staged.first_skipped(config, len(batch), message.resume)
    read = _next_reads.pop(_stream_key(message), None)  # its round before's invocation read its first already
    _forget_next_reads()
    # the round's samples are read while the model and the weights are, and the next round's model once merged
    with (
        _ahead(services, config, message),
        read or stream.Stream(lambda indices: _batch(reader, indices, config), left, micro, skip) as samples,
    ):
        if config.training.stale_weights and not message.resume:  # the next round's first micro-batches are read
            samples.then = functools.partial(_read_next, message, services)  # as this round's last computes
        entering = message.iteration - message.ahead  # launched ahead: its model is not merged
        if config.stage_blocks is None:
            trainer, start = _entering(services, config, message.generation, entering, predicted=message.ahead)
        else:  # stage 0 holds its own weights alone: the update is the stages' parts
            trainer, start = _stage_entering(services, config, message), None
        continued = message.resume or message.waited  # a continuation evaluates nothing
        splits = evaluated(config, message.iteration, count) if not continued else []
        if splits and _evaluate(message, config, services, trainer, splits) and _ended(services, message.run_id):
            return None  # early stopping ended the run: its update is not needed
        return _train(message, config, services, trainer, start, batches, samples, micro, resumed, entering)


def _batches(message: WorkMessage, config: RunConfig, services: Services) -> list[np.ndarray]:
    """The sample indices of each step of ``message``'s round."""
    spec = config.training
    if services.limits.worker_accelerator_gib is not None:  # a GPU worker reads in blocks unless told otherwise
        spec = spec.on_gpu_workers()
    trained = data.held_out(spec, reader_for(services.store, config).manifest.train.count)[0]  # less the held out
    slot, round_ = _task(message, config)
    order = data.block_order(spec, len(trained))
    return [trained[i] for i in data.round_batches(spec, len(trained), message.workers, slot, round_, order)]


def _task(message: WorkMessage, config: RunConfig) -> tuple[int, int]:
    """The slot and round whose batches ``message``'s round takes: its worker's of its iteration, or under ASP those
    its update number names."""
    if not config.training.asynchronous:
        return message.worker, message.iteration
    if message.update is None:
        raise BadInputError(
            f"work on model version {message.iteration} names no update number: staleness unbounded numbers"
            " each update it launches; launch the run again"
        )
    return data.asynchronous_task(message.update, message.workers)


_next_reads: dict[tuple[str, int, int, int, int, int], stream.Stream] = {}  # the next round's first micro-batches


def _stream_key(message: WorkMessage) -> tuple[str, int, int, int, int, int]:
    return (message.run_id, message.generation, message.iteration, message.worker, message.workers, message.resume)


def _read_next(message: WorkMessage, services: Services) -> None:
    """``stale_weights``: start reading the first micro-batches of the worker's next round, which the invocation may
    go on to (``going_on``), as this round's last micro-batch computes."""
    config = run_config(services, message.run_id)
    following = message.model_copy(update={"iteration": message.iteration + 1, "attempt": 0, "resume": 0})
    if not _goes_on(config, following.iteration, services):
        return
    reader, micro = reader_for(services.store, config), _micro_batch(config, services.limits.worker_accelerator_gib)
    batches = _batches(following, config, services)
    _next_reads[_stream_key(following)] = stream.Stream(lambda indices: _batch(reader, indices, config), batches, micro)


def _forget_next_reads() -> None:
    """The reads of a round the invocation did not go on to stop."""
    while _next_reads:
        _next_reads.popitem()[1].__exit__(None, None, None)


def _micro_batch(config: RunConfig, accelerator_gib: int | None) -> int:
    """The run's micro-batch on this function (``slsml.rounds.sizing``): its memory and its warm cache's bound, or
    a GPU worker's accelerator memory (the deployment's ``worker_accelerator_gib``)."""
    memory_mb, cache_mb = bounds.Limits.here().memory_bytes / bounds.MB, cache.limit_bytes() / bounds.MB
    return sizing.micro_batch(config, memory_mb, cache_mb, rules.slot_bytes(config), accelerator_gib)


def _scaling(
    services: Services, config: RunConfig, iteration: int, trainer: modelio.Trainer, rule: UpdateRule
) -> tuple[precision.Scaling | None, LossScale | None]:
    """The round's loss scaling (``slsml.training.precision``), and the dynamic scale it starts from: the one carried
    to the iteration where the run scales its loss dynamically, else its static ``loss_scale_factor`` (None: none)."""
    optimizer, batch = config.optimizer, config.training.global_batch
    if not rule.scales_loss:
        return None, None
    if precision.dynamic(optimizer, trainer.float16):
        scale = precision.entering(optimizer, _carried_scale(services, config, iteration))
        return precision.Scaling(scale.scale, batch), scale
    return (precision.Scaling(optimizer.loss_scale_factor, batch) if optimizer.loss_scale_factor else None), None


def _carried_scale(services: Services, config: RunConfig, iteration: int) -> LossScale | None:
    """The loss scale carried to ``iteration`` in shard 0's header (None: none, the first iteration's), read with the
    iteration's manifest, which must be the Merger's and name that shard (RunFailed if either was replaced)."""
    if iteration == 0:
        return None
    key = keys.shard(config.run_id, iteration, 0)
    manifest, shard = services.store.get_quorum(
        [keys.manifest(config.run_id, iteration), key], [None, (0, shards.HEADER_SIZE - 1)], 2, 0
    )
    assert manifest is not None and shard is not None  # every read is needed: none is left out
    named_shard(services.keys, config.run_id, iteration, 0, manifest, shard)
    return shards.loss_scale(shard.body)


def _resumed(message: WorkMessage, config: RunConfig, services: Services) -> progress.Progress | None:
    """The progress a continuation goes on from, as the pipeline stored it (None: a round's first invocation, or a
    round in stages, whose stages each go on from their own: ``slsml.pipeline.staged``)."""
    if not message.resume or config.stage_blocks is not None:
        return None
    key = keys.progress(message.run_id, message.iteration, message.worker, message.attempt, message.resume)
    try:
        return progress.Progress.decode(signed.read(services, message.run_id, key), config.plan.size, key)
    except BadInputError as error:
        raise RunFailed(str(error)) from None


def _batch(reader: data.DatasetReader, indices: np.ndarray, config: RunConfig) -> Batch:
    """A batch of training samples with their weights: the dataset's, or the run's class weights (None: none)."""
    x, y, w = reader.take_weighted("train", indices)
    if config.class_weights is None:
        return x, y, w
    assert isinstance(y, np.ndarray)  # class weights are refused for named labels (a model of several outputs)
    return x, y, weighting.of_classes(y, config.class_weights)


def _train(
    message: WorkMessage,
    config: RunConfig,
    services: Services,
    trainer: modelio.Trainer,
    start: np.ndarray | None,
    batches: list[np.ndarray],
    left: stream.Stream,
    micro_batch: int,
    resumed: progress.Progress | None,
    entering: int,
) -> Callable[[], WorkDone] | None:
    """The round's update from ``start`` (the weights entering iteration ``entering``; None: stage 0 of a round in
    stages, which holds its own) on its ``batches`` (their indices; ``left``: the micro-batches of those left to
    compute, ``micro_batch`` samples at most each): what stores and announces it, once computed; None where the round
    is handed on."""
    store, spec = services.store, config.training
    compression, rule = config.compression_at(message.iteration), rules.of(spec)
    weights = start if compression.kind == "significance" else None
    sizes = [len(b) for b in batches]
    samples = sum(sizes)
    optimizer = spec.local_optimizer_config()
    x, y, _ = left.steps[0][0]  # the first micro-batch read: compute starts (the others are read meanwhile)
    meter = evaluator_for(trainer, config, lambda: (samples_.take(x, slice(2)), samples_.take(y, slice(2))))
    trainer.meter = meter.batch_state
    pacer = progress.Pacer(  # sized as the plan sizes it: the progress of the whole round
        lifetime.remaining_s,
        progress.stored_bytes(
            config.plan.size,
            int(config.plan.trainable_mask().sum()),
            optimizer,
            len(batches),
            meter.size,
            local_weights=ALGORITHMS[spec.algorithm].local,
            partial=any(len(b) > micro_batch for b in batches),
        ),
    )
    trainer.scaling, loss_scale = _scaling(services, config, entering, trainer, rule)
    slot, round_ = _task(message, config)  # the round's random generators (a continuation's: from its micro-batch)
    per_round = accumulate.computed(sizes, micro_batch, len(sizes), 0)
    trainer.draws = Draws(trainer.model, spec.seed, round_, message.workers, slot, per_round, message.resume)
    with ThreadPoolExecutor(max_workers=1) as pool:  # the slot's residual is read while the update is computed
        residual = pool.submit(_residual, message, config, services) if compression.lossy else None
        started = time.perf_counter()
        before_s = resumed.compute_s if resumed is not None else 0.0
        hand = staged.Hand(services, message, config)
        update: modelio.Update | progress.Progress | staged.StagedUpdate | staged.Reached
        if start is not None:
            update = rule.round(Round(trainer, start, left.steps, spec, _Slot(services, message), resumed, pacer.pause))
        else:
            stage_resumed = hand.take_progress(0, message.resume) if message.resume else None
            before_s = stage_resumed.compute_s if stage_resumed is not None else 0.0
            try:
                update = staged.first_stage(hand, config, trainer, left.steps[0], left.steps[0].samples, stage_resumed)
            except staged.StageLost as lost:
                _left_to_deadline(lost)
                return None
        computed_s = time.perf_counter() - started
        compute_s = computed_s + before_s
        previous = residual.result() if residual is not None else None
    timing = left.timing()
    usage.streamed(usage.Streamed(micro_batch=micro_batch, compute_s=computed_s, **asdict(timing)))
    if isinstance(update, staged.Reached):
        _stage_hand_on(message, services, hand, update)
        return None
    if isinstance(update, progress.Progress):
        computed = accumulate.computed(sizes, micro_batch, update.steps, update.micro_batches)
        _hand_on(message, services, replace(update, compute_s=compute_s), computed)
        return None

    def finish() -> WorkDone:
        """The round's update, encoded, stored and announced."""
        values = update.finite if isinstance(update, staged.StagedUpdate) else bool(np.isfinite(update.vector).all())
        finite = bool(np.isfinite(update.loss)) and values
        # under loss scaling the update takes part whatever it holds: a non-finite gradient makes every shard skip
        # the step
        counted = finite or loss_scale is not None
        overflow = (
            loss_scale is not None
            and isinstance(update, modelio.Update)
            and not np.isfinite(update.vector[config.plan.trainable_mask()]).all()
        )
        if compression.lossy:  # error feedback: the residual is stored first, create-only (see slsml.training.feedback)
            assert isinstance(update, modelio.Update)  # (stages send dense updates)
            compressed = feedback.compress(
                update.vector, previous, config.plan, compression, samples, rule.kind, weights
            )
            body, header = compressed.update
            residual_key = keys.residual(message.run_id, message.iteration, message.worker)
            signed.put(services, message.run_id, residual_key, feedback.encode_residual(compressed.residual))
        elif isinstance(update, staged.StagedUpdate):  # the stages' parts as stored, named by the update's index
            body, header = update.index.encode(), updates.header(config.plan.size, samples, rule.kind).metadata
        else:
            body, header = updates.encode(update.vector, samples, rule.kind, compression, config.plan)
        report: dict[str, Any] = {
            "run_id": message.run_id,
            "iteration": message.iteration,
            "generation": message.generation,
            "worker": message.worker,
            "attempt": message.attempt,
            "samples": int(samples),
            "loss": float(update.loss) if np.isfinite(update.loss) and counted else 0.0,
            "compute_s": float(compute_s),
            "finite": bool(counted),
            "stale": message.ahead,
        }
        # a non-finite update's metrics are left out; a metric's NaN or Inf is reported, as Keras shows it
        metrics = update.metrics.tolist() if counted and update.metrics is not None else None
        scaled = {} if loss_scale is None else precision.metadata(loss_scale, not overflow)
        # the report as stored with the update, without its metrics (S3 metadata holds 2 KB: a retry computes them anew)
        # and its ETag (S3 gives it the bytes stored)
        metadata = {"done": json.dumps(report), **header, **scaled}
        log = {"run_id": message.run_id, "iteration": message.iteration, "worker": message.worker}
        if not counted:
            logger.warning("non-finite update", extra={**log, "loss": repr(update.loss)})
        elif loss_scale is not None and overflow:
            logger.info(
                "gradient not finite under loss scaling: the step is skipped", extra={**log, **asdict(loss_scale)}
            )
        key = keys.update(message.run_id, message.iteration, message.worker, message.attempt)
        # an object of other bytes at the key is not this worker's: it is replaced (put_own), never announced
        created, etag = store.put_own(key, body, metadata=metadata)
        if not created:  # a duplicate or a retry: announce the stored update (a resumed run may announce it again)
            report = {**json.loads((store.head(key) or {})["done"]), "generation": message.generation}
        # the report names its update by the ETag S3 gave it: its readers take no other bytes
        # (slsml.pipeline.steps.reducer)
        return WorkDone.model_validate({**report, "metrics": metrics, "etag": etag})

    return finish


def _later_stage(message: WorkMessage, config: RunConfig, services: Services) -> None:
    """Stage ``message.pipeline_stage`` (after the first) of the worker's round in pipeline stages
    (``slsml.pipeline.staged``), from the model entering the iteration, which it evaluates first where it is due (a
    round's first invocation; past the budget, the final model alone); the last stage reads the round's labels and
    tracks its metrics."""
    trainer = _stage_entering(services, config, message)
    reader = reader_for(services.store, config)
    continued = message.resume or message.waited  # a continuation evaluates nothing
    splits = evaluated(config, message.iteration, reader.manifest.train.count) if not continued else []
    final = message.iteration >= config.training.iterations
    try:
        ending = bool(splits) and _evaluate(message, config, services, trainer, splits)
    except staged.StageLost as lost:
        _left_to_deadline(lost)
        return
    if final or (ending and _ended(services, config.run_id)):  # early stopping ended the run: its round is not needed
        return
    (batch,) = _batches(message, config, services)
    micro_batch = config.training.micro_batch or len(batch)
    hand = staged.Hand(services, message, config)
    resumed = hand.take_progress(message.pipeline_stage, message.resume) if message.resume else None
    with ExitStack() as reads:

        def labelled(skip: int) -> stream.Step:
            samples = reads.enter_context(
                stream.Stream(lambda indices: _batch(reader, indices, config), [batch], micro_batch, skip)
            )
            x, y, _ = samples.steps[0][0]
            meter = evaluator_for(trainer, config, lambda: (samples_.take(x, slice(2)), samples_.take(y, slice(2))))
            trainer.meter = meter.batch_state
            return samples.steps[0]

        try:
            reached = staged.later_stage(hand, config, trainer, batch, labelled, resumed)
        except staged.StageLost as lost:
            _left_to_deadline(lost)
            return
    if reached is not None:
        _stage_hand_on(message, services, hand, reached)


def _stage_entering(services: Services, config: RunConfig, message: WorkMessage) -> modelio.Trainer:
    """The warm model of the message's pipeline stage (its own weights alone held: ``stage_trainer_for``) at the
    weights entering the iteration, of which only the stage's are read."""
    assert config.stage_blocks is not None
    trainer = stage_trainer_for(services.store, config, message.pipeline_stage)
    own = staged.own_weights(trainer.model, config.stage_blocks, message.pipeline_stage)
    values = load_weights(services.store, config, message.iteration, services.keys, staged.spans(own))
    staged.set_own(own, values)
    return trainer


def _left_to_deadline(lost: staged.StageLost) -> None:
    """What a stage waited on did not come: its round is left to the deadline's re-launch of all its stages (or
    needed no more: its run ended, or went on without it)."""
    if isinstance(lost, staged.RunMovedOn):
        logger.info("the run moved on: a stage stops waiting", extra={"waited_on": str(lost)})
        return
    logger.warning("a stage's round did not come: left to the deadline", extra={"waited_on": str(lost)})


def _hand_on(message: WorkMessage, services: Services, reached: progress.Progress, done: int) -> None:
    """The invocation's time runs short: store the round's progress (create-only: a duplicate's or a retry's is the
    same), record that the round goes on, and have a fresh invocation of the same attempt go on from it (unless
    the attempt was superseded meanwhile). Its duplicates are handled once (``functions/worker``)."""
    key = keys.progress(message.run_id, message.iteration, message.worker, message.attempt, done)
    signed.put(services, message.run_id, key, reached.encode())
    _go_on(message, services, {"resume": done}, {"micro_batches": done})


def _stage_hand_on(message: WorkMessage, services: Services, hand: staged.Hand, reached: staged.Reached) -> None:
    """A stage's invocation's time runs short: as ``_hand_on``, its stage's progress stored (signed, create-only); an
    invocation that computed no pass hands the same progress on (stored already, or none), once more waited."""
    about = {"pipeline_stage": message.pipeline_stage, "passes": reached.done}
    if reached.done == message.resume:
        _go_on(message, services, {"waited": message.waited + 1}, about | {"waited": message.waited + 1})
        return
    hand.put_progress(message.pipeline_stage, reached)
    _go_on(message, services, {"resume": reached.done, "waited": 0}, about)


def _go_on(message: WorkMessage, services: Services, update: dict[str, int], about: dict[str, int]) -> None:
    """Record that the round goes on and have a fresh invocation of the same attempt go on as ``message`` with
    ``update`` (unless the attempt was superseded meanwhile)."""
    until = time.time() + lifetime.lifetime_s() + HAND_ON_S
    log = {"run_id": message.run_id, "iteration": message.iteration, "worker": message.worker, **about}
    if not services.table.record_continuation(
        message.run_id, message.iteration, message.worker, message.attempt, message.generation, until
    ):
        logger.info("round superseded: not handed on", extra=log)
        return
    services.bus.publish(wiring.WORK, [message.model_copy(update=update)])
    logger.info("round handed on to a fresh invocation", extra=log)


def _evaluate(
    message: WorkMessage, config: RunConfig, services: Services, trainer: modelio.Trainer, splits: list[str]
) -> bool:
    """Store the states of evaluating the trainer's model (the one entering the iteration) on this worker's slice of
    each split, create-only; if every worker's states are in, record the results (``_recorded``). In pipeline stages
    each stage computes its layers on the slice, and the last the states (``staged.evaluate``): only it stores and
    records them (False for the others). StageLost where a later stage's input did not come."""
    store, run, iteration = services.store, message.run_id, message.iteration
    reader = reader_for(store, config)
    samples = evaluating.split_samples(config, reader.manifest)
    stages = config.stage_blocks
    stage, last = message.pipeline_stage, stages is None or message.pipeline_stage == len(stages) - 1
    evaluator = evaluator_for(trainer, config, lambda: reader.take("test", samples["test"][:2]))
    if stages is None:  # a forward pass takes less than a step
        batch = min(evaluation.EVALUATION_BATCH, _micro_batch(config, services.limits.worker_accelerator_gib))
    else:
        batch, hand = staged.evaluation_batch(config), staged.Hand(services, message, config)
    for split in splits:
        mine = samples[split][evaluation.slice_of(len(samples[split]), message.workers, message.worker)]
        started, cpu, traces = time.perf_counter(), time.process_time(), evaluator.traces
        # read a batch at a time, ahead of the one evaluated, with the dataset's weights, as evaluate takes them (a
        # stage between the first and the last reads none)
        take = functools.partial(reader.take_weighted, evaluating.READ[split])
        reads = stream.Stream(take, [mine], batch, even=False) if stage == 0 or last else None
        with reads or ExitStack():
            batches = None if reads is None else reads.steps[0]
            state: np.ndarray | None
            if stages is None:
                assert batches is not None
                state = evaluator.state_of(batches, batch)
            else:
                count = -(-len(mine) // batch)
                state = staged.evaluate(hand, config, trainer.model, split, count, batches, evaluator)
        if state is None:
            continue
        timed = SliceEvaluated(
            run_id=run,
            iteration=iteration,
            worker=message.worker,
            split=split,
            samples=len(mine),
            wall_s=time.perf_counter() - started,
            cpu_s=time.process_time() - cpu,
            traced=evaluator.traces > traces,
        )
        logger.info(SLICE_EVALUATED, extra={SLICE_KEY: timed.model_dump()})
        signed.put(services, run, keys.evaluation(run, iteration, message.worker, split), npz.encode_array(state))
    return last and _recorded(message, config, services, evaluator, splits)


def _recorded(
    message: WorkMessage, config: RunConfig, services: Services, evaluator: evaluation.Evaluator, splits: list[str]
) -> bool:
    """If every worker's states of ``splits`` are in, sum them and record the results on the iteration before's
    counter (that iteration's reducers stored the model's shards); past the budget, or where early stopping ends the
    run, have the watchdog complete the run (True). Each worker lists the states after storing its own, so the last
    to store finds them all (two may: the results are the same)."""
    store, run, iteration = services.store, message.run_id, message.iteration
    wanted = {split: [keys.evaluation(run, iteration, w, split) for w in range(message.workers)] for split in splits}
    stored = {key for split in splits for key in store.list_keys(keys.evaluations_prefix(run, iteration, split))}
    if not all(set(keys_) <= stored for keys_ in wanted.values()):
        return False
    # one not stored by the pipeline (placed before its worker stored its own) is replaced by that worker, which then
    # finds them all: until then they are not all in
    try:
        found = {split: store.read_many(keys_) for split, keys_ in wanted.items()}
    except NotFoundError:  # (deleted as its worker replaces it)
        return False
    if any(
        signed.problem(services, run, key, state) is not None
        for split, keys_ in wanted.items()
        for key, state in zip(keys_, found[split], strict=True)
    ):
        return False
    for split, states in found.items():
        try:
            figures = evaluator.result(npz.decode_array(state.body) for state in states)
        except ValueError as error:
            raise RunFailed(f"the {split} evaluation of the model entering iteration {iteration}: {error}") from None
        services.table.record_evaluation(run, iteration - 1, split, figures, config.training.monitors)
        logger.info(
            "model evaluated", extra={"run_id": run, "iteration": iteration, "split": split, "figures": figures}
        )
    if iteration >= config.training.iterations or stop_reason(config, services.table) is not None:
        services.ask_watchdog(run, iteration, message.generation)  # the run is complete: the watchdog completes it
        return True
    return False


def _ended(services: Services, run_id: str) -> bool:
    """Whether the run ended within ``END_WAIT_S`` (the watchdog completing it), read every ``END_POLL_S``: until
    then its iteration does not go on without this worker's update."""
    deadline = time.monotonic() + END_WAIT_S
    while time.monotonic() < deadline:
        run = services.table.get_run(run_id)
        if run.final_key is not None or run.status != RunStatus.RUNNING:
            return True
        time.sleep(END_POLL_S)
    return False


def _residual(message: WorkMessage, config: RunConfig, services: Services) -> np.ndarray | None:
    """What compression left out of this worker slot's updates up to the iteration before, as the pipeline stored it
    (None: nothing)."""
    if message.iteration <= config.dense_warmup:  # the first compressed round: nothing was left out before it
        return None
    key = keys.residual(message.run_id, message.iteration - 1, message.worker)
    try:
        body = signed.read(services, message.run_id, key)
    except NotFoundError:
        logger.info(
            "no residual of the iteration before: starting from zeros",
            extra={"run_id": message.run_id, "iteration": message.iteration, "worker": message.worker},
        )
        return None
    try:
        return feedback.decode_residual(body, config.plan, key)
    except feedback.ResidualError as error:
        raise RunFailed(str(error)) from None


class _Slot:
    """The worker slot's state objects (``keys.local_state``), for the run's update rule: signed, and read as the
    pipeline stored them (``slsml.pipeline.signed``)."""

    def __init__(self, services: Services, message: WorkMessage) -> None:
        self.services, self.message = services, message

    def where(self, previous: bool = False) -> str:
        message = self.message
        return keys.local_state(message.run_id, message.iteration - previous, message.worker)

    def previous(self) -> bytes | None:
        if self.message.iteration == 0:
            return None
        body = self._get(self.where(previous=True))
        if body is None:
            logger.info(
                "no slot state of the round before: starting fresh",
                extra={
                    "run_id": self.message.run_id,
                    "iteration": self.message.iteration,
                    "worker": self.message.worker,
                },
            )
        return body

    def put(self, body: bytes) -> bool:
        return signed.put(self.services, self.message.run_id, self.where(), body)

    def current(self) -> bytes | None:
        return self._get(self.where())

    def _get(self, key: str) -> bytes | None:
        try:
            return signed.read(self.services, self.message.run_id, key)
        except NotFoundError:
            return None
