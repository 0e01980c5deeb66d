"""GPU throughput as ``slsml bench gpu`` measured it on a machine with a GPU: samples per second of one model at each
accelerator memory (a logical device of that memory, as one execution environment of a GPU function has), in float32
and under mixed precision, and the fraction of the card's peak that is (the model's training FLOPs per sample ×
samples/s ÷ the card's published peak in that precision). The plan times GPU workers of that very card by it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from slsml.spec.errors import BadInputError

Precision = Literal["float32", "mixed_float16", "mixed_bfloat16"]
CALIBRATION_FILE = Path(".slsml/gpu-calibration.json")  # where ``slsml bench gpu`` writes it, unless told


class GpuThroughput(BaseModel):
    """One measurement: a model's training steps at one accelerator memory and precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerator_gib: int = Field(gt=0)
    precision: Precision
    micro_batch: int = Field(ge=1, description="samples per step: the most that fit the accelerator memory")
    samples_per_s: float = Field(gt=0)
    achieved_fraction: float | None = Field(
        gt=0, description="samples/s × the model's training FLOPs per sample ÷ the card's peak; None: no datasheet"
    )


class GpuCalibration(BaseModel):
    """What ``slsml bench gpu`` measured, on which card and model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    card: str = Field(description="the GPU, as slsml.cost.cards.DATASHEETS names it")
    model: str = Field(description="the model measured, e.g. ResNet50 224x224x3")
    params: int = Field(gt=0)
    train_flops_per_sample: int = Field(gt=0, description="the model's training step, one sample (slsml.cost.flops)")
    sample_shape: tuple[int, ...]
    measured_at: str = Field(description="ISO 8601, UTC")
    entries: tuple[GpuThroughput, ...]

    def samples_per_s(self, accelerator_gib: int, precision: Precision) -> float | None:
        """The throughput measured at ``accelerator_gib`` in ``precision``; None where it was not measured."""
        for entry in self.entries:
            if entry.accelerator_gib == accelerator_gib and entry.precision == precision:
                return entry.samples_per_s
        return None

    def fraction(self, accelerator_gib: int, precision: Precision) -> float | None:
        """The fraction of the card's peak achieved at ``accelerator_gib`` in ``precision``; None where it was not
        measured."""
        for entry in self.entries:
            if entry.accelerator_gib == accelerator_gib and entry.precision == precision:
                return entry.achieved_fraction
        return None

    def card_fraction(self, precision: Precision) -> float | None:
        """The whole card's fraction of its peak in ``precision``: that measured at the most memory; None where none
        was."""
        measured = [entry for entry in self.entries if entry.precision == precision]
        return max(measured, key=lambda entry: entry.accelerator_gib).achieved_fraction if measured else None

    def measures(self, card: str) -> bool:
        """Whether this calibration was measured on ``card`` (names compared as ``card_key`` reduces them)."""
        return card_key(self.card) == card_key(card)


def card_key(name: str) -> str:
    """A GPU's name reduced to what tells cards apart: ``NVIDIA L40S`` → ``l40s``."""
    return "".join(c for c in name.lower() if c.isalnum()).removeprefix("nvidia")


def load_calibration(path: Path) -> GpuCalibration:
    """The calibration stored at ``path``, or ``BadInputError`` naming what is wrong with it."""
    try:
        return GpuCalibration.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such GPU calibration (`slsml bench gpu` writes one)") from None
    except ValueError as error:
        lines = str(error).splitlines()
        why = f"{lines[1]}: {lines[2].strip()}" if len(lines) > 2 else lines[0]
        raise BadInputError(
            f"{path}: not a GPU calibration of this slsml ({why}); run `slsml bench gpu` again"
        ) from None
