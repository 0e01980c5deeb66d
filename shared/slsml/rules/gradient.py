"""Gradient averaging (synchronous data-parallel SGD): a worker computes the gradient of its slice of the round's
global batch, a micro-batch at a time; the reducers average the gradients, weighted by samples, and step the run's
optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from slsml.rounds import accumulate
from slsml.rules.base import Round, UpdateRule
from slsml.spec.config import TrainingSpec
from slsml.training.progress import Partial, Progress

if TYPE_CHECKING:
    from slsml.training.modelio import Update


class GradientAveraging(UpdateRule):
    kind = "gradient"
    staged = True
    fit_state = True  # the reducers step the run's optimizer with the batch's gradient, as fit does
    scales_loss = True  # and decide on its loss scale (slsml.training.precision)

    def round(self, work: Round) -> Update | Progress:
        (batch,) = work.batches
        partial = None if work.resumed is None else work.resumed.partial
        ended = accumulate.step_update(work.trainer, batch, partial, work.pause)
        if isinstance(ended, Partial):  # no local weights: the micro-batches added up are the progress
            return Progress(0, np.zeros(0, np.float32), {}, (), None, partial=ended if ended.done else None)
        return ended

    def describe(self, spec: TrainingSpec, optimizer: str, local: str) -> str:
        return f"optimizer: {optimizer}"


RULE = GradientAveraging()
