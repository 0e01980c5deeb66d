"""Gradient averaging (synchronous data-parallel SGD): a worker computes the gradient of its slice of the round's
global batch; the reducers average the gradients, weighted by samples, and step the run's optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slsml.rules.base import Round, UpdateRule
from slsml.spec.config import TrainingSpec

if TYPE_CHECKING:
    from slsml.training.modelio import Update


class GradientAveraging(UpdateRule):
    kind = "gradient"
    fit_state = True  # the reducers step the run's optimizer with the batch's gradient, as fit does

    def round(self, work: Round) -> Update:
        (batch,) = work.batches
        return work.trainer.compute_update(*batch)

    def describe(self, spec: TrainingSpec, optimizer: str, local: str) -> str:
        return f"optimizer: {optimizer}"


RULE = GradientAveraging()
