"""One step's update computed a micro-batch at a time: the gradient of a batch's loss is the sum of its
micro-batches' gradients, each weighted by its share of the batch's samples (Keras's loss is the mean over the
batch, its samples' weights included: Σ wᵢ·lossᵢ / n), added up in float64; so are the loss and, regularization
included, every figure that is a mean over the batch. The metrics' states are sums already and add as they are.

Layers whose output depends on the batch (BatchNormalization) see each micro-batch alone, as each replica sees its
own batch under ``tf.distribute`` without synchronized batch statistics: every micro-batch's forward pass starts
from the same non-trainable values, and the step's new values (moving mean and variance) are the micro-batches'
values after their passes, averaged by share, as the reducers average them across workers. A batch of one
micro-batch is computed in one pass, exactly as before.

Between micro-batches the step may stop (``pause``: its invocation's time runs short); what was added up so far is
its ``Partial``, which a fresh invocation goes on from, computing the same values in the same order."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from slsml.spec import samples
from slsml.training import progress
from slsml.training.progress import Partial
from slsml.training.weighting import Batch

if TYPE_CHECKING:
    from slsml.training.modelio import Trainer, Update


NOT_BEGUN = Partial(0, np.zeros(0), 0.0, None)  # a step stopped before its first micro-batch


class StepBatch(Protocol):
    """One step's batch of ``samples`` samples as its micro-batches in order (``slsml.rounds.stream.Step``)."""

    samples: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Batch: ...


class Whole(list[Batch]):
    """A step's batch in one micro-batch."""

    def __init__(self, batch: Batch) -> None:
        super().__init__([batch])
        self.samples = samples.count(batch[1])


def step_update(
    trainer: Trainer,
    micro_batches: StepBatch,
    partial: Partial | None = None,
    pause: Callable[[], bool] = progress.never,
) -> Update | Partial:
    """The update of one step whose batch is ``micro_batches``, from the trainer's model as it is; ``partial``: its
    first micro-batches already added up (``micro_batches`` are the ones left). Before each micro-batch ``pause()``
    may stop the step: then the micro-batches added up so far."""
    from slsml.training.modelio import Update

    done = 0 if partial is None else partial.done
    if partial is None and len(micro_batches) == 1:  # the whole batch at once, as a step without micro-batches
        return NOT_BEGUN if pause() else trainer.compute_update(*micro_batches[0])
    untrained = trainer.untrained_values()  # every micro-batch's forward pass starts from these
    total = np.zeros(trainer.plan.size) if partial is None else partial.vector  # a continuation's own: added to
    loss, metrics = (0.0, None) if partial is None else (partial.loss, partial.metrics)
    for number in range(len(micro_batches)):
        if pause():
            return Partial(done + number, total, loss, metrics) if done + number else NOT_BEGUN
        if number:
            trainer.restore_untrained(untrained)
        batch = micro_batches[number]
        update = trainer.compute_update(*batch)
        share = samples.count(batch[1]) / micro_batches.samples
        _add_scaled(total, update.vector, share)
        loss += share * update.loss
        if update.metrics is not None:
            metrics = update.metrics if metrics is None else metrics + update.metrics
    return Update(vector=total.astype(np.float32), loss=loss, metrics=metrics)


ADD_CHUNK = 1 << 20  # values added at a time: the float64 temporaries of a chunk, not of the model


def _add_scaled(total: np.ndarray, vector: np.ndarray, share: float) -> None:
    """``total += share · vector`` in float64, a chunk at a time, so that no model-sized temporary is made."""
    for start in range(0, len(total), ADD_CHUNK):
        part = slice(start, start + ADD_CHUNK)
        total[part] += share * vector[part].astype(np.float64)


def sizes(samples_in_batch: int, micro_batch: int) -> list[int]:
    """The sizes of a batch's micro-batches: as few as hold at most ``micro_batch`` samples each, as even as can be
    (the larger first), so that no micro-batch is a small remainder."""
    count = -(-samples_in_batch // micro_batch)
    small, larger = divmod(samples_in_batch, count)
    return [small + 1] * larger + [small] * (count - larger)


def computed(batches: list[int], micro_batch: int, steps: int, micro_batches: int) -> int:
    """Micro-batches a round of batches of ``batches`` samples has computed after ``steps`` steps and
    ``micro_batches`` of the next: where a round handed on stands (``WorkMessage.resume``)."""
    return sum(len(sizes(samples, micro_batch)) for samples in batches[:steps]) + micro_batches
