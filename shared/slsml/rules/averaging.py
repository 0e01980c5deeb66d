"""Model averaging (local SGD, FedAvg/FedOpt): a worker starts from the round's model, takes one local step
per global batch of the round with the run's local optimizer (numpy, as the reducers' optimizers) on
its slice of each, and sends its weight change. The reducers average the changes, weighted by samples,
and apply them (``ModelAveraging.server_optimizer``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from slsml.rounds import accumulate
from slsml.rounds.accumulate import StepBatch
from slsml.rules.base import Round, SlotTraffic, UpdateRule, archive_bytes
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import npz, optimizers
from slsml.training import progress as progress_
from slsml.training.optimizers import State
from slsml.training.progress import Partial, Progress

if TYPE_CHECKING:
    from slsml.training.modelio import Trainer, Update


class ModelAveraging(UpdateRule):
    """With ``local_state`` keep, the local optimizer goes on from the state the worker slot stored after the
    round before (fresh if there is none), and the slot stores its state after the round."""

    kind = "weight change"

    def round(self, work: Round) -> Update | Progress:
        keep = work.spec.local_state == "keep"
        previous = work.slot.previous() if keep and work.resumed is None else None
        state = None if previous is None else npz.decode(previous)
        optimizer = work.spec.local_optimizer_config()
        progress, finished = local_steps(
            work.trainer, work.start, work.batches, optimizer, state, resumed=work.resumed, pause=work.pause
        )
        if not finished:
            return progress
        if keep:  # create-only: a retry's state, computed from the same start, is the same
            work.slot.put(npz.encode(**progress.state))
        return weight_change(work.trainer, work.start, progress)

    def describe(self, spec: TrainingSpec, optimizer: str, local: str) -> str:
        state = "kept per worker slot" if spec.local_state == "keep" else "fresh every round"
        server = (
            "the reducers apply the average weight change (FedAvg)"
            if spec.server == "average"
            else f"the reducers step {optimizer} with the average weight change (FedOpt)"
        )
        return f"model averaging: {spec.local_steps} local steps a round of {local} (state {state}); {server}"

    def server_optimizer(self, spec: TrainingSpec, optimizer: OptimizerConfig) -> OptimizerConfig:
        """FedAvg (``server`` average): a step of SGD at rate 1, which moves each weight by the average weight
        change; FedOpt (``server`` optimizer): the run's optimizer with it as the gradient."""
        return SERVER_AVERAGE if spec.server == "average" else optimizer

    def slot_traffic(self, spec: TrainingSpec, params: int, trainable: int) -> SlotTraffic:
        if spec.local_state != "keep":
            return SlotTraffic()
        return SlotTraffic(archive_bytes(optimizers.initial_state(spec.local_optimizer_config(), 0), trainable))


SERVER_AVERAGE = OptimizerConfig(name="sgd", learning_rate=1.0)


def weight_change(trainer: Trainer, start: np.ndarray, progress: Progress) -> Update:
    """The update of a round from ``start`` that ended at ``progress``: start minus end for trainable weights, the
    values after the last forward pass for the others, the mean loss over the steps and their metrics' summed state."""
    from slsml.training.modelio import Update

    trainable = trainer.plan.trainable_mask()
    change = progress.weights.copy()
    change[trainable] = start[trainable] - progress.weights[trainable]
    return Update(vector=change, loss=progress.loss, metrics=progress.metrics)


def local_steps(
    trainer: Trainer,
    start: np.ndarray,
    batches: Sequence[StepBatch],
    optimizer: OptimizerConfig,
    state: State | None,
    pull: Callable[[np.ndarray], np.ndarray] | None = None,
    resumed: Progress | None = None,
    pause: Callable[[], bool] = progress_.never,
) -> tuple[Progress, bool]:
    """Steps of the local optimizer from the flat weights ``start``, one per batch, each on the batch's gradient
    plus ``pull(trainable weights)`` if given (e.g. ADMM's proximal term), each batch's gradient added up over its
    micro-batches; ``resumed``: the round goes on from this progress, ``batches`` being the ones left. Before each
    micro-batch, ``pause()`` may stop the round (its invocation's time runs short:
    ``slsml.training.progress.Pacer``). Returns the progress (the end weights, non-trainable ones: their values after
    the last forward pass; the optimizer's state; the steps' losses and their metrics' summed state; the micro-batches
    of the step under way) and whether every batch was stepped on. The trainer's model ends at the weights reached."""
    from slsml.training import modelio

    trainable = trainer.plan.trainable_mask()
    partial: Partial | None = None
    if resumed is None:
        current, steps, losses, metrics = start.copy(), 0, [], None
        state = optimizers.initial_state(optimizer, int(trainable.sum())) if state is None else state
    else:
        current, steps, state = resumed.weights.copy(), resumed.steps, resumed.state
        losses, metrics, partial = list(resumed.losses), resumed.metrics, resumed.partial
    finished = True
    for batch in batches:
        modelio.set_flat(trainer.model, trainer.plan, current)
        step = accumulate.step_update(trainer, batch, partial, pause)
        if isinstance(step, Partial):
            partial, finished = (step if step.done else None), False
            break
        partial = None
        losses.append(step.loss)
        if step.metrics is not None:
            metrics = step.metrics if metrics is None else metrics + step.metrics
        gradient = step.vector[trainable] if pull is None else step.vector[trainable] + pull(current[trainable])
        current[trainable], state = optimizers.apply(optimizer, current[trainable], gradient, state)
        current[~trainable] = step.vector[~trainable]
        steps += 1
    modelio.set_flat(trainer.model, trainer.plan, current)
    return Progress(steps, current, state, tuple(losses), metrics, partial=partial), finished


RULE = ModelAveraging()
