"""A worker's round in pipeline stages, each a Worker invocation of its own (``WorkMessage.pipeline_stage``): the
run's start splits the model at cut points (``configured``: the blocks each stage holds, its compute as even as can
be, each stage's step within the worker's memory), and every launch of a worker launches its stages together.

Stage 0 reads the round's micro-batches and hands each one's output forward; each stage after it takes its input,
computes its layers and hands its output on; the last computes the loss and hands the gradient of its input back,
and so on back to stage 0 (GPipe, with a flush: all forward passes, then all backward passes, each stage computing
its forward pass again from its input, ``slsml.training.stages.StageRunner``). What a stage hands on is a create-only
object of the round's attempt (``keys.handed``), signed by the pipeline (``slsml.pipeline.signed``: an object placed at
its key before it is replaced, and none the pipeline did not store is taken); a stage polls for its input, and
every ``RUN_CHECK_S`` of its polls reads whether its run still trains the round (it stops where the run ended or went
on without it). Each stage stores its part of the update as its round ends (a later stage before it hands its last
gradient back): its weights' gradients and new non-trainable values, float32 in the update's order, as they are
(create-only, a large one in parts: ``keys.stage_values``); a later stage then stores a signed record naming them by
their ETag, with its loss and, the last, its metrics (``Part``). Stage 0 takes the records and stores, at the
worker's update's key, the update's index (``updates.StagedIndex``: which runs of the flat vector each part holds, and
each part's ETag), and announces it as any worker announces its update. Each reducer reads the index (of the ETag
the worker reported), then the ranges of the parts its shard spans (each of the ETag the index names), so that no
function holds or moves the whole update, and the reducers, the deadlines and the rest of the pipeline are those of
a run of one stage.

A stage's round is passes (each micro-batch's forward pass, then each one's backward pass; the last stage's backward
passes alone). Where the invocation's time runs short (``Pace``: before a pass, as a worker's round before a
micro-batch; or while it waits), the stage stores its progress (``Reached``: its sums, its random generators' states,
its metrics), signed and create-only, and hands the rest of the round on to a fresh invocation of the same attempt, as
a worker does (``WorkMessage.resume``: the passes done). An invocation that waits out its time before computing a
pass hands on the same progress (``WorkMessage.waited``), as long as its waits stay within the run's deadline: past
it, its round is left to the deadline, which re-launches all of its stages with a new attempt.

What stages take: the gradient-averaging rule (one step a round), dense float32 updates. Each stage function holds
one micro-batch's layer outputs of its own stage and its own layers' weights alone: its warm model is built from the
archive's config with no memory for the other layers' weights, and it reads its own weights' ranges of the shards
(``slsml.pipeline.steps.warm.stage_trainer_for``, ``own_weights``), whatever the model's size.

Where a round evaluates the model entering it (and past the budget, where the final model alone is evaluated), its
stages evaluate it before they train, through themselves (``evaluate``): stage 0 reads the worker's slice of each
split a batch at a time and hands on its layers' output of each batch, computed in inference mode, with the
regularization penalties of its layers; each later stage takes it, computes its own layers, adds its own penalties and
hands on; the last computes the loss (penalties included, as ``evaluate`` adds them) and the metrics on the batches'
labels, stores the slice's state and records the figures once every worker's are in, as a worker does
(``slsml.training.evaluation``)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from aws_lambda_powertools import Logger

from slsml import rules
from slsml.aws import cache
from slsml.pipeline import lifetime, signed
from slsml.pipeline.services import Services
from slsml.rounds import sizing
from slsml.rounds.accumulate import sizes
from slsml.rounds.stages import POLL_S, RUN_CHECK_S, deployed, held, unfit
from slsml.spec import keys, samples
from slsml.spec.config import RunConfig
from slsml.spec.errors import BadInputError, NotFoundError, RunFailed
from slsml.spec.messages import WorkMessage
from slsml.state.records import RunStatus
from slsml.training import npz, progress, updates
from slsml.training.generators import Draws
from slsml.training.weighting import Batch

if TYPE_CHECKING:
    from slsml.training.stages import StageRunner

logger = Logger(child=True)


class StageLost(Exception):
    """What a stage waits on did not come within the run's deadline (its waits in earlier invocations counted): the
    round is left to the deadline's re-launch."""


class RunMovedOn(StageLost):
    """The run ended, or went past the round's iteration, while a stage waited: nothing will come."""


class HandOn(Exception):
    """The invocation's time runs short while the stage waits, once it has computed a pass: its round is handed on
    from where it is."""


@dataclass(frozen=True)
class Reached:
    """A stage's round after its first ``done`` passes (each micro-batch's forward pass in turn, then each one's
    backward pass; the last stage's are its backward passes alone): its runner's state (``StageRunner.saved``), the
    state of its metrics (the last stage's) and its compute so far, over the invocations."""

    done: int
    runner: dict[str, np.ndarray]
    metrics: np.ndarray | None
    compute_s: float

    def encode(self) -> bytes:
        metrics = {} if self.metrics is None else {"metrics": self.metrics}
        runner = {_RUNNER + name: value for name, value in self.runner.items()}
        return npz.encode(done=np.array(self.done, np.int64), compute_s=np.array(self.compute_s), **metrics, **runner)

    @classmethod
    def decode(cls, body: bytes) -> Reached:
        arrays = npz.decode(body)
        return cls(
            done=int(arrays["done"]),
            runner={name[len(_RUNNER) :]: value for name, value in arrays.items() if name.startswith(_RUNNER)},
            metrics=arrays.get("metrics"),
            compute_s=float(arrays["compute_s"]),
        )


_RUNNER = "runner."  # prefix of the runner state's arrays in a stage's stored progress


WAIT_RESERVE_S = 1.0  # what an invocation that computed no pass keeps for handing on: a record and a message


class Pace:
    """When a stage's invocation hands its round on: before a pass, as a worker's round does before a micro-batch
    (``progress.Pacer``: never before the invocation's first); and while it waits for its input, where the time left
    would not store its progress and hand it on. An invocation that computed no pass waits out its time
    (``WAIT_RESERVE_S`` left) and hands on (its continuation goes on from the same progress, ``WorkMessage.waited``)
    while the invocations that waited so far (``waited``, each of ``lifetime.lifetime_s``) are within ``deadline_s``:
    past it, the round is left to the deadline, as a wait within one invocation is."""

    def __init__(self, start: int, progress_bytes: int, waited: int = 0, deadline_s: float = 0.0) -> None:
        self.start = self.at = start
        self.progress_bytes = progress_bytes
        self.waited, self.deadline_s = waited, deadline_s
        self.began = time.perf_counter()
        self._pacer = progress.Pacer(lifetime.remaining_s, progress_bytes)

    def before(self, unit: int) -> bool:
        """Before pass ``unit``: True if the invocation must hand the round on instead."""
        self.at = unit
        return self._pacer.pause()

    def waiting(self) -> bool:
        """While the stage waits: True if it must hand the round on now."""
        left = lifetime.remaining_s()
        if self.at > self.start:
            return left < progress.reserve_s(self.progress_bytes, 0.0)
        return left < WAIT_RESERVE_S and (self.waited + 1) * lifetime.lifetime_s() <= self.deadline_s


def refusal(config: RunConfig) -> str | None:
    """Why the run's options cannot train in pipeline stages (None: they can)."""
    spec, count = config.training, config.training.pipeline_stages
    given = {
        f"--algorithm {spec.algorithm}": not rules.of(spec).staged,
        f"--compress {spec.compression.kind}": spec.compression.kind != "none",
        f"--stale-weights {spec.stale_weights}": bool(spec.stale_weights),
        "--staleness unbounded": spec.asynchronous,
        f"--mixed-precision {spec.mixed_precision}": spec.mixed_precision is not None,
        "loss scaling": bool(config.optimizer.loss_scale_factor or config.optimizer.dynamic_loss_scale),
    }
    taken = [option for option, asked in given.items() if asked]
    if not taken:
        return None
    return (
        f"--pipeline-stages {count}: stages train with the gradient-averaging rule's dense float32 updates, not with"
        f" {', '.join(taken)}; leave {'it' if len(taken) == 1 else 'them'} out, or train in one stage"
    )


def configured(config: RunConfig, model: Any, worker_memory_mb: int) -> RunConfig:
    """``config`` with the blocks each of its ``pipeline_stages`` holds: the split whose largest stage computes least,
    each stage's step fitting a worker of ``worker_memory_mb`` (the weights its function holds beside one micro-batch
    of its layers' outputs: ``held``); its micro-batch, where not given, the most that fit every stage.
    BadInputError, naming what prevents it, where the options, the model's cut points or the memory rule the stages
    out."""
    from slsml.cost.stages import blocks_of
    from slsml.training import stages

    count = config.training.pipeline_stages
    if (why := refusal(config) or stages.refusal(model, count)) is not None:
        raise BadInputError(why)
    whole = sizing.of_run(config, worker_memory_mb, cache.MEMORY_SHARE * worker_memory_mb, rules.slot_bytes(config))
    blocks = blocks_of(model)
    split = deployed(blocks, count, whole)
    if split is None:
        raise BadInputError(unfit(blocks, count, whole))
    most = min(held(stage, whole).micro_batch() for stage in split)
    asked = config.training.micro_batch
    if asked is not None and asked > most:
        raise BadInputError(
            f"--micro-batch {asked}: a step of {asked} samples through {count} stages does not fit a worker of"
            f" {worker_memory_mb:,} MB; {most:,} fit (leave --micro-batch out to compute in those)"
        )
    training = config.training.model_copy(update={"micro_batch": asked or min(most, config.training.global_batch)})
    return config.model_copy(update={"training": training, "stage_blocks": tuple(len(s.blocks) for s in split)})


_splits: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], list[Any]]] = weakref.WeakKeyDictionary()


def stage_models(model: Any, blocks: Sequence[int]) -> list[Any]:
    """The stage sub-models of ``model`` (sharing its layers, so its weights) holding ``blocks`` blocks each, made
    once per warm model."""
    from slsml.training import stages

    kept = _splits.get(model)
    if kept is None or kept[0] != tuple(blocks):
        kept = tuple(blocks), stages.split(model, blocks)
        _splits[model] = kept
    return kept[1]


def own_weights(model: Any, blocks: Sequence[int], stage: int) -> list[tuple[Any, int]]:
    """The weights of stage ``stage`` of ``model`` (``stage_models``), each with its offset in the flat vector (the
    model's weights in order, ``ShardPlan``'s), in that order."""
    mine = {id(v) for v in stage_models(model, blocks)[stage].weights}
    offsets = np.cumsum([0, *(int(np.prod(v.shape)) for v in model.weights)])
    return [(v, int(offset)) for v, offset in zip(model.weights, offsets, strict=False) if id(v) in mine]


def spans(weights: Sequence[tuple[Any, int]]) -> list[tuple[int, int]]:
    """The [start, stop) ranges of the flat vector that ``weights`` (``own_weights``) fill, neighbours joined."""
    found: list[tuple[int, int]] = []
    for variable, offset in weights:
        stop = offset + int(np.prod(variable.shape))
        if found and found[-1][1] == offset:
            found[-1] = (found[-1][0], stop)
        else:
            found.append((offset, stop))
    return found


def set_own(weights: Sequence[tuple[Any, int]], values: np.ndarray) -> None:
    """Set ``weights`` (``own_weights``) from ``values``: their elements one after the other, in order (what
    ``load_weights`` reads of their ``spans``)."""
    at = 0
    for variable, _ in weights:
        size = int(np.prod(variable.shape))
        variable.assign(values[at : at + size].reshape(variable.shape))
        at += size


def shares(batch: np.ndarray, micro_batch: int) -> list[float]:
    """Each micro-batch's share of the samples of a step of ``batch`` (its sample indices)."""
    return [size / len(batch) for size in sizes(len(batch), micro_batch)]


def part_values(
    stage_model: Any, own: Sequence[tuple[Any, int]], gradients: Sequence[Any], untrained: Sequence[Any]
) -> list[np.ndarray]:
    """A stage's part of the update, in the update's order (its weights, ``own``: ``own_weights``): each trainable
    weight's gradient and each non-trainable one's new value (``gradients``, ``untrained``: in ``stage_model``'s
    order), each flat float32."""
    by_weight = {id(v): g for v, g in zip(stage_model.trainable_weights, gradients, strict=True)}
    by_weight |= {id(v): u for v, u in zip(stage_model.non_trainable_weights, untrained, strict=True)}
    return [np.ascontiguousarray(by_weight[id(v)], dtype="<f4").ravel() for v, _ in own]


@dataclass(frozen=True)
class Part:
    """A later stage's part of the update as stage 0 takes it: the ETag and bytes of its values (``Hand.put_part``),
    whether they are all finite, its loss (its regularization; the last stage's: with the round's loss) and, the last
    stage's, the state of its metrics."""

    etag: str
    size: int
    finite: bool
    loss: float
    metrics: np.ndarray | None

    def encode(self) -> bytes:
        metrics = {} if self.metrics is None else {"metrics": self.metrics}
        return npz.encode(
            etag=np.array(self.etag),
            size=np.array(self.size, np.int64),
            finite=np.array(self.finite),
            loss=np.array(self.loss, np.float64),
            **metrics,
        )

    @classmethod
    def decode(cls, body: bytes) -> Part:
        arrays = npz.decode(body)
        return cls(
            str(arrays["etag"]),
            int(arrays["size"]),
            bool(arrays["finite"]),
            float(arrays["loss"]),
            arrays.get("metrics"),
        )


@dataclass(frozen=True)
class StagedUpdate:
    """A worker's update in stages as stage 0 announces it: its loss, the state of its metrics, whether its entries
    are all finite, and its index (``updates.StagedIndex``: the stages' parts as stored, which the reducers read by
    range)."""

    loss: float
    metrics: np.ndarray | None
    finite: bool
    index: updates.StagedIndex


def stage_runs(model: Any, blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """The runs of the flat vector (stage, first element, elements) that each stage's part of the update holds, in
    order: each stage's weights (``own_weights``), neighbours of one stage joined."""
    owner = {id(v): stage for stage in range(len(blocks)) for v, _ in own_weights(model, blocks, stage)}
    runs: list[tuple[int, int, int]] = []
    at = 0
    for variable in model.weights:
        stage, size = owner[id(variable)], int(np.prod(variable.shape))
        if runs and runs[-1][0] == stage:
            runs[-1] = (stage, runs[-1][1], runs[-1][2] + size)
        elif size:
            runs.append((stage, at, size))
        at += size
    return runs


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # (numpy's arrays are buffers)


class Hand:
    """What the stages of one worker's round (its attempt) hand each other: stored create-only, signed, and taken
    once there, within the run's deadline."""

    def __init__(self, services: Services, message: WorkMessage, config: RunConfig) -> None:
        self.services, self.message, self.config = services, message, config
        self.pace: Pace | None = None  # the stage's, while it computes its round
        self.unchecked_s = 0.0  # waited since the stage last read whether its run trains the round

    def _key(self, stage: int, micro_batch: int, back: bool) -> str:
        m = self.message
        return keys.handed(m.run_id, m.iteration, m.worker, m.attempt, stage, micro_batch, back)

    def _part_key(self, stage: int) -> str:
        m = self.message
        return keys.stage_part(m.run_id, m.iteration, m.worker, m.attempt, stage)

    def give(self, stage: int, micro_batch: int, back: bool, value: Any) -> None:
        """Hand on stage ``stage``'s output of ``micro_batch`` (``back``: the gradient of its input)."""
        self._put(self._key(stage, micro_batch, back), npz.encode_array(value))

    def take(self, stage: int, micro_batch: int, back: bool) -> np.ndarray:
        """What stage ``stage`` handed on for ``micro_batch``, once there."""
        return npz.decode_array(self._wait(self._key(stage, micro_batch, back)))

    def give_evaluated(self, stage: int, split: str, batch: int, output: Any, regularization: float) -> None:
        """Hand on stage ``stage``'s output of ``batch`` of the worker's slice of ``split`` as the stages evaluate the
        model, with the regularization penalties of the stages up to it."""
        body = npz.encode(output=np.asarray(output), regularization=np.array(regularization, np.float64))
        self._put(self._evaluation_key(stage, split, batch), body)

    def take_evaluated(self, stage: int, split: str, batch: int) -> tuple[np.ndarray, float]:
        """What stage ``stage`` handed on for ``batch`` of ``split`` (``give_evaluated``), once there."""
        arrays = npz.decode(self._wait(self._evaluation_key(stage, split, batch)))
        return arrays["output"], float(arrays["regularization"])

    def _evaluation_key(self, stage: int, split: str, batch: int) -> str:
        m = self.message
        return keys.handed_evaluation(m.run_id, m.iteration, m.worker, m.attempt, stage, split, batch)

    def _values_key(self, stage: int) -> str:
        m = self.message
        return keys.stage_values(m.run_id, m.iteration, m.worker, m.attempt, stage)

    def put_values(self, stage: int, values: Sequence[np.ndarray]) -> str:
        """Stage ``stage``'s part of the update, its ``values`` (``part_values``) stored as they are, create-only
        (``ObjectStore.put_own_streamed``: a large one in parts, no copy of it made): their ETag."""
        size = sum(v.nbytes for v in values)
        return self.services.store.put_own_streamed(self._values_key(stage), size, lambda: map(_bytes_of, values), {})[
            1
        ]

    def put_part(self, stage: int, values: Sequence[np.ndarray], loss: float, metrics: np.ndarray | None) -> None:
        """A later stage's part of the update: its ``values`` (``put_values``), then what stage 0 takes of it
        (``Part``, signed), which names them by their ETag."""
        etag = self.put_values(stage, values)
        finite = all(bool(np.isfinite(v).all()) for v in values)
        self._put(self._part_key(stage), Part(etag, sum(v.nbytes for v in values), finite, loss, metrics).encode())

    def take_part(self, stage: int) -> Part:
        """Stage ``stage``'s part of the update, once there."""
        return Part.decode(self._wait(self._part_key(stage)))

    def _progress_key(self, stage: int, done: int) -> str:
        m = self.message
        return keys.stage_progress(m.run_id, m.iteration, m.worker, m.attempt, stage, done)

    def put_progress(self, stage: int, reached: Reached) -> None:
        """Stage ``stage``'s round as it is handed on (create-only: a duplicate's or a retry's is the same)."""
        self._put(self._progress_key(stage, reached.done), reached.encode())

    def take_progress(self, stage: int, done: int) -> Reached:
        """The progress a continuation of stage ``stage`` goes on from: RunFailed, naming it, unless the pipeline
        stored it."""
        key = self._progress_key(stage, done)
        try:
            return Reached.decode(signed.read(self.services, self.message.run_id, key))
        except NotFoundError:
            raise RunFailed(f"{key}: the progress a stage's round goes on from is not stored") from None

    def _put(self, key: str, body: bytes) -> None:
        signed.put(self.services, self.message.run_id, key, body)

    def _wait(self, key: str) -> bytes:
        """The body at ``key`` once the pipeline stored it (an object there that it did not store, placed before the
        stage that hands it on replaces it, is not taken: logged, and waited past); HandOn where the stage's pace says
        so; StageLost past the run's deadline, or where the invocation's time runs out first; RunMovedOn where the run
        ended or went past the round's iteration (read every ``RUN_CHECK_S`` of waiting)."""
        until = time.monotonic() + self.config.training.deadline_s
        foreign = False
        while True:
            try:
                found = self.services.store.read(key)
                if signed.problem(self.services, self.message.run_id, key, found) is None:
                    return found.body
                if not foreign:
                    logger.warning("an object not stored by the pipeline is not taken: waiting", extra={"key": key})
                foreign = True
            except NotFoundError:
                pass
            if self.pace is not None and self.pace.waiting():
                raise HandOn(key)
            if time.monotonic() > until or lifetime.remaining_s() < 2 * POLL_S:
                raise StageLost(key)
            time.sleep(POLL_S)
            self.unchecked_s += POLL_S
            if self.unchecked_s >= RUN_CHECK_S:
                self.unchecked_s = 0.0
                run = self.services.table.get_run(self.message.run_id)
                if run.status != RunStatus.RUNNING or run.iteration > self.message.iteration:
                    raise RunMovedOn(key)


def evaluation_batch(config: RunConfig) -> int:
    """The samples of each batch the stages evaluate a slice in: a forward pass of a micro-batch's samples at most,
    the stages' step fitting it (``configured``)."""
    from slsml.training.evaluation import EVALUATION_BATCH

    return min(EVALUATION_BATCH, config.training.micro_batch or EVALUATION_BATCH)


def evaluate(
    hand: Hand, config: RunConfig, model: Any, split: str, count: int, batches: Iterable[Batch] | None, evaluator: Any
) -> np.ndarray | None:
    """Stage ``hand.message.pipeline_stage``'s part of evaluating ``model`` (the weights entering the round) on the
    worker's slice of ``split``, of ``count`` batches: each batch's output computed in inference mode on its input
    (stage 0: ``batches``' x; a later stage: what the stage before handed on) and handed on with the regularization
    penalties of the stages so far. The last stage computes, with ``evaluator`` (``slsml.training.evaluation``), the
    loss and metrics on ``batches``' labels, and returns their state (the other stages: None)."""
    assert config.stage_blocks is not None
    stage = hand.message.pipeline_stage
    parts = stage_models(model, config.stage_blocks)
    own = parts[stage]

    def computed(given: Any, regularization: float) -> tuple[Any, float]:
        return own(given, training=False), regularization + sum(float(loss) for loss in own.losses)

    def taken(number: int) -> tuple[Any, float]:
        return computed(*hand.take_evaluated(stage - 1, split, number))

    if stage == 0:
        assert batches is not None
        for number, (x, _, _) in enumerate(batches):
            hand.give_evaluated(0, split, number, *computed(x, 0.0))
        return None
    if stage < len(parts) - 1:
        for number in range(count):
            hand.give_evaluated(stage, split, number, *taken(number))
        return None
    assert batches is not None
    return evaluator.state_of_predictions(
        (output, y, w, regularization)
        for number, (_, y, w) in enumerate(batches)
        for output, regularization in [taken(number)]
    )


def first_stage(
    hand: Hand,
    config: RunConfig,
    trainer: Any,
    micro_batches: Sequence[Batch],
    samples_in_step: int,
    resumed: Reached | None,
) -> StagedUpdate | Reached:
    """Stage 0's round: its micro-batches (x, y, w) through its layers forward, then the gradients handed back
    through them; its own part of the update stored, and the update's index of every stage's part
    (``StagedUpdate``). A continuation goes on from ``resumed``; where the invocation's time runs short, the round's
    progress (``Reached``) instead."""
    from slsml.training.stages import StageRunner, handed_back

    assert config.stage_blocks is not None
    parts = stage_models(trainer.model, config.stage_blocks)
    count = _micro_batches(config, samples_in_step)
    runner, kept = StageRunner(parts[0], last=False, draws=_draws(hand, config, trainer, count)), {}
    pace = hand.pace = _pace(hand, runner, resumed)
    skipped = first_skipped(config, samples_in_step, pace.start)
    try:
        for number, (x, y, _) in enumerate(micro_batches, skipped):
            share = samples.count(y) / samples_in_step
            kept[number] = x, share
            if number >= pace.start:
                if pace.before(number):
                    return _reached(pace, runner, None, resumed)
                hand.give(0, number, False, runner.forward(number, x, share))
        for number, (x, share) in kept.items():
            unit = count + number
            if unit >= pace.start:
                if pace.before(unit):
                    return _reached(pace, runner, None, resumed)
                runner.backward(number, x, share, handed_back(hand.take(1, number, True)))
        pace.at = 2 * count  # every pass done: the later stages' parts are taken
        later = [hand.take_part(stage) for stage in range(1, len(parts))]
    except HandOn:
        return _reached(pace, runner, None, resumed)
    mine = part_values(parts[0], own_weights(trainer.model, config.stage_blocks, 0), *runner.finish())
    etag = hand.put_values(0, mine)
    before_last = runner.loss + sum(taken.loss for taken in later[:-1])  # their regularization
    metrics = later[-1].metrics
    if metrics is not None:  # the loss the metrics track: each stage's regularization too (the last added its own)
        metrics = np.array(metrics)
        metrics[0] += metrics[1] * before_last
    return StagedUpdate(
        loss=before_last + later[-1].loss,
        metrics=metrics,
        finite=all(taken.finite for taken in later) and all(bool(np.isfinite(v).all()) for v in mine),
        index=updates.StagedIndex(
            tuple(stage_runs(trainer.model, config.stage_blocks)), (etag, *(taken.etag for taken in later))
        ),
    )


def first_skipped(config: RunConfig, samples_in_step: int, done: int) -> int:
    """The micro-batches stage 0's round after ``done`` passes no longer reads: those whose backward pass is done (a
    continuation in its forward passes reads every one again, for its backward passes)."""
    count = _micro_batches(config, samples_in_step)
    return max(0, min(done, 2 * count) - count)


def _micro_batches(config: RunConfig, samples_in_step: int) -> int:
    """The micro-batches of a worker's step of ``samples_in_step`` samples in stages."""
    return len(sizes(samples_in_step, config.training.micro_batch or samples_in_step))


def later_stage(
    hand: Hand,
    config: RunConfig,
    trainer: Any,
    batch: np.ndarray,
    labelled: Callable[[int], Sequence[Batch]],
    resumed: Reached | None,
) -> Reached | None:
    """Stage ``hand.message.pipeline_stage``'s round (after the first) of the step of ``batch`` (its sample indices):
    each micro-batch's input taken, its output handed on; then each gradient taken and its input's handed back. The last
    stage computes the loss on ``labelled(skip)``'s micro-batches (the step's, its first ``skip`` left out), with the
    trainer's metrics. Its part of the update is stored before it hands its last gradient back. A continuation goes on
    from ``resumed``; where the invocation's time runs short, the round's progress is returned (None: done)."""
    from slsml.training.stages import StageRunner, handed_back

    assert config.stage_blocks is not None
    stage = hand.message.pipeline_stage
    parts = stage_models(trainer.model, config.stage_blocks)
    last = stage == len(parts) - 1
    each = shares(batch, config.training.micro_batch or len(batch))
    runner = StageRunner(parts[stage], last=last, draws=_draws(hand, config, trainer, len(each)))
    pace = hand.pace = _pace(hand, runner, resumed)
    if last:
        return _last_stage(hand, trainer, runner, pace, each, labelled, resumed)
    try:
        for number, share in enumerate(each):
            if number >= pace.start:
                if pace.before(number):
                    return _reached(pace, runner, None, resumed)
                hand.give(stage, number, False, runner.forward(number, hand.take(stage - 1, number, False), share))
        for number, share in enumerate(each):
            unit = len(each) + number
            if unit >= pace.start:
                if pace.before(unit):
                    return _reached(pace, runner, None, resumed)
                gradient = runner.backward(
                    number, hand.take(stage - 1, number, False), share, handed_back(hand.take(stage + 1, number, True))
                )
                if number == len(each) - 1:
                    hand.put_part(stage, _own_part(trainer.model, config, stage, runner), runner.loss, None)
                hand.give(stage, number, True, gradient)
    except HandOn:
        return _reached(pace, runner, None, resumed)
    return None


def _last_stage(
    hand: Hand,
    trainer: Any,
    runner: StageRunner,
    pace: Pace,
    each: list[float],
    labelled: Callable[[int], Sequence[Batch]],
    resumed: Reached | None,
) -> Reached | None:
    """The last stage's round (``later_stage``): its passes backward alone, each micro-batch's loss and metrics on its
    labels."""
    import tensorflow as tf

    stage = hand.message.pipeline_stage
    micro_batches = labelled(pace.start)  # (sets the trainer's meter: its metrics on the round's labels)
    loss_fn, meter = trainer.loss_fn, trainer.meter
    metrics = None if resumed is None else resumed.metrics
    try:
        for number, ((_, y, w), share) in enumerate(zip(micro_batches, each[pace.start :], strict=True), pace.start):
            if pace.before(number):
                return _reached(pace, runner, metrics, resumed)
            yt = tf.nest.map_structure(tf.convert_to_tensor, y)
            weights = None if w is None else tf.convert_to_tensor(w)
            seen: list[Any] = []  # the forward pass's prediction and loss, which the metrics track

            def loss_of(output: Any, yt: Any = yt, weights: Any = weights, seen: list[Any] = seen) -> Any:
                loss = loss_fn(yt, output, sample_weight=weights)
                seen.extend((output, loss))
                return loss

            gradient = runner.backward(number, hand.take(stage - 1, number, False), share, loss_of)
            if meter is not None:
                state = meter(y, seen[0], weights, float(seen[1]) + runner.regularization)
                metrics = state if metrics is None else metrics + state
            if number == len(each) - 1:
                hand.put_part(stage, _own_part(trainer.model, hand.config, stage, runner), runner.loss, metrics)
            hand.give(stage, number, True, gradient)
    except HandOn:
        return _reached(pace, runner, metrics, resumed)
    return None


def _own_part(model: Any, config: RunConfig, stage: int, runner: StageRunner) -> list[np.ndarray]:
    """Stage ``stage``'s part of the update as its round ends (``part_values``)."""
    assert config.stage_blocks is not None
    own = own_weights(model, config.stage_blocks, stage)
    return part_values(stage_models(model, config.stage_blocks)[stage], own, *runner.finish())


def _draws(hand: Hand, config: RunConfig, trainer: Any, micro_batches: int) -> Draws:
    """What sets the random generators of the worker's round of ``micro_batches`` micro-batches, as a round in one
    stage sets them (``slsml.training.generators``): the same masks, whatever stage computes a layer."""
    m = hand.message
    return Draws(trainer.model, config.training.seed, m.iteration, m.workers, m.worker, micro_batches)


def _pace(hand: Hand, runner: StageRunner, resumed: Reached | None) -> Pace:
    """The stage's pace, its runner gone on from ``resumed`` (RunFailed if that is not the stage's saved state)."""
    if resumed is not None:
        try:
            runner.restore(resumed.runner)
        except ValueError as error:
            raise RunFailed(f"a stage's round goes on from progress that is not its own: {error}") from None
    stored = sum(value.nbytes for value in runner.saved().values())
    deadline_s = hand.config.training.deadline_s
    return Pace(0 if resumed is None else resumed.done, stored, hand.message.waited, deadline_s)


def _reached(pace: Pace, runner: StageRunner, metrics: np.ndarray | None, resumed: Reached | None) -> Reached:
    """The stage's round as it is handed on, before pass ``pace.at``; its time so far, ``resumed``'s and this
    invocation's."""
    before = 0.0 if resumed is None else resumed.compute_s
    return Reached(pace.at, runner.saved(), metrics, before + time.perf_counter() - pace.began)
