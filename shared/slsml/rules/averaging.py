"""Model averaging (local SGD, FedAvg/FedOpt): a worker starts from the round's model, takes one local step
per global batch of the round with the run's local optimizer (numpy, as the reducers' optimizers) on
its slice of each, and sends its weight change. The reducers average the changes, weighted by samples,
and apply them (``RunConfig.server_optimizer``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from slsml.spec.config import OptimizerConfig
from slsml.training import modelio, optimizers
from slsml.training.optimizers import State


def take_local_steps(
    trainer: modelio.Trainer,
    start: np.ndarray,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    optimizer: OptimizerConfig,
    state: State | None,
) -> tuple[modelio.Update, State]:
    """Steps from the flat weights ``start``, one per batch; returns the update (start minus end for trainable
    weights, the values after the last forward pass for the others, the mean loss and accuracy over the
    steps) and the local optimizer's state (``state`` None: fresh). The trainer's model ends at the end
    weights."""
    end, state, loss, accuracy = local_steps(trainer, start, batches, optimizer, state)
    trainable = trainer.plan.trainable_mask()
    change = end.copy()
    change[trainable] = start[trainable] - end[trainable]
    return modelio.Update(vector=change, loss=loss, accuracy=accuracy), state


def local_steps(
    trainer: modelio.Trainer,
    start: np.ndarray,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    optimizer: OptimizerConfig,
    state: State | None,
    pull: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, State, float, float | None]:
    """Steps of the local optimizer from the flat weights ``start``, one per batch, each on the batch's gradient
    plus ``pull(trainable weights)`` if given (e.g. ADMM's proximal term); returns the end weights (non-trainable
    ones: their values after the last forward pass), the optimizer's state and the mean loss and accuracy over
    the steps. The trainer's model ends at the end weights."""
    trainable = trainer.plan.trainable_mask()
    current = start.copy()
    state = optimizers.initial_state(optimizer, int(trainable.sum())) if state is None else state
    losses: list[float] = []
    accuracies: list[float] = []
    for x, y in batches:
        modelio.set_flat(trainer.model, trainer.plan, current)
        step = trainer.compute_update(x, y)
        losses.append(step.loss)
        if step.accuracy is not None:
            accuracies.append(step.accuracy)
        gradient = step.vector[trainable] if pull is None else step.vector[trainable] + pull(current[trainable])
        current[trainable], state = optimizers.apply(optimizer, current[trainable], gradient, state)
        current[~trainable] = step.vector[~trainable]
    modelio.set_flat(trainer.model, trainer.plan, current)
    return current, state, float(np.mean(losses)), float(np.mean(accuracies)) if accuracies else None
