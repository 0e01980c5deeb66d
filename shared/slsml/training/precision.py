"""Loss scaling for mixed precision: the loss scale a run carries between iterations and how its workers and reducers
agree on it, as Keras's ``LossScaleOptimizer`` scales the loss of a model that computes in float16.

Keras's dynamic loss scaling: the loss is multiplied by the scale before the gradient is computed and the gradient
divided by it, so that float16's small gradients do not flush to zero; a step whose gradient is not finite is skipped
and the scale halved; after ``dynamic_growth_steps`` finite steps in a row the scale is doubled. A run scales its loss
so where its optimizer is a ``LossScaleOptimizer`` or its model computes in float16 (``compile`` wraps the optimizer
of a ``mixed_float16`` model in one); ``loss_scale_factor`` is Keras's static scaling, a constant scale.

In the pipeline (gradient averaging):

- **The scale** entering an iteration, with the finite steps counted since it last changed (Keras's
  ``dynamic_scale`` and ``step_counter``), is carried in the header of every shard object (``slsml.training.shards``)
  beside the optimizer's state; a worker reads shard 0's (the first iteration's: ``initial_scale``).
- **A worker** multiplies the loss of each batch it computes by the scale times the batch's share of the global batch
  (as ``tf.distribute`` divides each replica's loss by the replicas), so that its float16 values are those of one
  process computing the global batch, and divides the gradient by the same factor. Its update's metadata
  (``METADATA``) says the scale it computed with and whether its gradient was finite. An update that is not finite
  takes part in the step like a finite one: it is not left out, since it makes every shard skip the step.
- **Every reducer** reads every participant's metadata with its part (``agree``): if any participant's gradient is
  not finite, every shard skips the step (its weights and optimizer state carried over, as one replica's non-finite
  gradient makes every replica skip under ``tf.distribute``) and halves the scale; else it steps, and the scale grows
  as Keras grows it. Each shard stores the same next scale (a shard the watchdog keeps, the scale it entered with). A
  late update folded into a later step (``staleness``) whose gradient was not finite is left out of it.

Cost: beside the weights, each worker of a run that scales its loss dynamically reads shard 0's header and the
iteration's manifest that names it (two small GETs, at once); the scale adds about 30 bytes to each update's
metadata.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slsml.spec.config import OptimizerConfig
from slsml.training.updates import UpdateFormatError

METADATA = "slsml-loss-scale"  # an update's: "<scale>/<finite steps>/<1: finite, 0: not>"
_F = np.float32


@dataclass(frozen=True)
class LossScale:
    """Keras's ``dynamic_scale`` (a float32) and ``step_counter``: the finite steps since the scale last changed."""

    scale: float
    steps: int = 0

    def after(self, finite: bool, growth_steps: int) -> LossScale:
        """The scale after a step whose gradient was ``finite`` or not, as ``LossScaleOptimizer.apply`` leaves it."""
        if not finite:
            return LossScale(float(_F(self.scale) * _F(0.5)), 0)
        if self.steps == growth_steps - 1:
            return LossScale(float(_F(self.scale) * _F(2.0)), 0)
        return LossScale(self.scale, self.steps + 1)


@dataclass(frozen=True)
class Scaling:
    """What a worker multiplies a batch's loss by: ``scale`` times the batch's share of the ``global_batch``."""

    scale: float
    global_batch: int

    def factor(self, samples: int) -> float:
        """The factor of a batch of ``samples`` samples (its gradient is divided by it again)."""
        return self.scale * samples / self.global_batch


def dynamic(optimizer: OptimizerConfig, float16: bool) -> bool:
    """Whether a run of ``optimizer`` scales its loss dynamically, its model computing in float16 or not."""
    return optimizer.dynamic_loss_scale or float16


def entering(optimizer: OptimizerConfig, carried: LossScale | None) -> LossScale:
    """The scale a step starts from: the one carried to it (None: none, the first step's), else ``initial_scale``."""
    return carried if carried is not None else LossScale(float(_F(optimizer.initial_scale)))


def metadata(scale: LossScale, finite: bool) -> dict[str, str]:
    """An update's metadata: the scale it was computed with and whether its gradient was finite."""
    return {METADATA: f"{scale.scale!r}/{scale.steps}/{int(finite)}"}


@dataclass(frozen=True)
class Reported:
    """What an update's metadata says: the scale it was computed with, and whether its gradient was finite."""

    scale: LossScale
    finite: bool


def reported(stored: dict[str, str]) -> Reported | None:
    """An update's report of its loss scale, from its metadata (None: it was computed without one);
    UpdateFormatError if it is not one."""
    text = stored.get(METADATA)
    if text is None:
        return None
    try:
        scale, steps, finite = text.split("/")
        report = Reported(LossScale(float(scale), int(steps)), finite == "1")
    except ValueError:
        raise UpdateFormatError(f"its {METADATA} metadata {text!r} is not <scale>/<steps>/<finite>") from None
    if not (
        math.isfinite(report.scale.scale) and report.scale.scale > 0 and report.scale.steps >= 0 and finite in "01"
    ):
        raise UpdateFormatError(f"its {METADATA} metadata {text!r} is not a loss scale")
    return report


def agree(reports: Sequence[Reported | None]) -> tuple[LossScale | None, bool]:
    """The scale a step's updates (each one's report, none late) were computed with, and whether all their gradients
    are finite; (None, True) where none scaled its loss. ValueError where they do not agree."""
    scales = {report.scale if report is not None else None for report in reports}
    if len(scales) > 1:
        raise ValueError(f"the updates of one step were computed with different loss scales ({scales})")
    (scale,) = scales or {None}
    return scale, all(report is None or report.finite for report in reports)
