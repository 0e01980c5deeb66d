"""Learning-rate schedules of ``keras.optimizers.schedules``, declared as Keras serializes them (less the
``name``) and evaluated in numpy at the optimizer's step with Keras's float32 arithmetic."""

from __future__ import annotations

import math
from typing import Annotated, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

_F = np.float32


class _Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_learning_rate: float = Field(ge=0)


class _Decay(_Schedule):
    decay_steps: float = Field(gt=0)
    decay_rate: float
    staircase: bool = False

    def _progress(self, step: int) -> np.float32:
        """step / decay_steps, whole decay periods only with ``staircase``."""
        p = _F(step) / _F(self.decay_steps)
        return np.floor(p) if self.staircase else p


class ExponentialDecay(_Decay):
    class_name: Literal["ExponentialDecay"] = "ExponentialDecay"

    def rate(self, step: int) -> np.float32:
        return _F(self.initial_learning_rate) * np.power(_F(self.decay_rate), self._progress(step))


class InverseTimeDecay(_Decay):
    class_name: Literal["InverseTimeDecay"] = "InverseTimeDecay"

    def rate(self, step: int) -> np.float32:
        return _F(self.initial_learning_rate) / (_F(1) + _F(self.decay_rate) * self._progress(step))


class PiecewiseConstantDecay(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    class_name: Literal["PiecewiseConstantDecay"] = "PiecewiseConstantDecay"
    boundaries: tuple[float, ...] = Field(min_length=1)
    values: tuple[float, ...]

    @model_validator(mode="after")
    def _one_more_value(self) -> PiecewiseConstantDecay:
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError(
                f"{len(self.boundaries)} boundaries need {len(self.boundaries) + 1} values, not {len(self.values)}"
            )
        if any(a >= b for a, b in zip(self.boundaries, self.boundaries[1:], strict=False)):
            raise ValueError(f"boundaries {self.boundaries} must increase")
        return self

    def rate(self, step: int) -> np.float32:
        # Keras casts the boundaries to the (integer) step's dtype: truncation
        for boundary, value in zip(self.boundaries, self.values, strict=False):
            if step <= math.trunc(boundary):
                return _F(value)
        return _F(self.values[-1])


class PolynomialDecay(_Schedule):
    class_name: Literal["PolynomialDecay"] = "PolynomialDecay"
    decay_steps: float = Field(gt=0)
    end_learning_rate: float = 0.0001
    power: float = 1.0
    cycle: bool = False

    def rate(self, step: int) -> np.float32:
        t, decay_steps = _F(step), _F(self.decay_steps)
        if self.cycle:
            decay_steps = decay_steps * (_F(1) if step == 0 else np.ceil(t / decay_steps))
        else:
            t = np.minimum(t, decay_steps)
        p = t / decay_steps
        initial, end = _F(self.initial_learning_rate), _F(self.end_learning_rate)
        return (initial - end) * np.power(_F(1) - p, _F(self.power)) + end


class CosineDecay(_Schedule):
    class_name: Literal["CosineDecay"] = "CosineDecay"
    decay_steps: float = Field(gt=0)
    alpha: float = 0.0
    warmup_target: float | None = None
    warmup_steps: float = Field(default=0, ge=0)

    def rate(self, step: int) -> np.float32:
        t, decay_steps, initial = _F(step), _F(self.decay_steps), _F(self.initial_learning_rate)
        if self.warmup_target is None:
            return self._decayed(np.minimum(t, decay_steps), decay_steps, initial)
        target, warmup_steps = _F(self.warmup_target), _F(self.warmup_steps)
        t = np.minimum(t, decay_steps + warmup_steps)
        if t < warmup_steps:
            return (target - initial) * (t / warmup_steps) + initial
        return self._decayed(t - warmup_steps, decay_steps, target)

    def _decayed(self, t: np.float32, decay_steps: np.float32, start: np.float32) -> np.float32:
        cosine = _F(0.5) * (_F(1) + np.cos(_F(math.pi) * (t / decay_steps)))
        return start * (_F(1 - self.alpha) * cosine + _F(self.alpha))


class CosineDecayRestarts(_Schedule):
    class_name: Literal["CosineDecayRestarts"] = "CosineDecayRestarts"
    first_decay_steps: float = Field(gt=0)
    t_mul: float = Field(default=2.0, gt=0)
    m_mul: float = 1.0
    alpha: float = 0.0

    def rate(self, step: int) -> np.float32:
        alpha, t_mul, m_mul = _F(self.alpha), _F(self.t_mul), _F(self.m_mul)
        fraction = _F(step) / _F(self.first_decay_steps)
        if t_mul == _F(1):
            restart = np.floor(fraction)
            fraction = fraction - restart
        else:
            restart = np.floor(np.log(_F(1) - fraction * (_F(1) - t_mul)) / np.log(t_mul))
            done = (_F(1) - np.power(t_mul, restart)) / (_F(1) - t_mul)
            fraction = (fraction - done) / np.power(t_mul, restart)
        cosine = _F(0.5) * np.power(m_mul, restart) * (_F(1) + np.cos(_F(math.pi) * fraction))
        return _F(self.initial_learning_rate) * ((_F(1) - alpha) * cosine + alpha)


Schedule = Annotated[
    ExponentialDecay | InverseTimeDecay | PiecewiseConstantDecay | PolynomialDecay | CosineDecay | CosineDecayRestarts,
    Field(discriminator="class_name"),
]
NAMES = tuple(member.model_fields["class_name"].default for member in get_args(get_args(Schedule)[0]))
KERAS_MODULE = "keras.optimizers.schedules"
