"""The ``compress`` option: what workers send to the reducers, and the update encoding each choice selects
(the format itself is ``slsml.training.updates``)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

DENSE_F32, DENSE_F16, TOP_K, SIGNIFICANCE, SPARSE = 0, 1, 2, 3, 4  # the update format's encodings, by number
COMPRESS_FORMS = (
    "none, sparse (exact: the update's nonzero entries, e.g. the rows of an embedding a round touched), fp16,"
    " topk:F (0 < F ≤ 1: the fraction of each part sent) or significance:V (V > 0: the change relative to its"
    " weight an entry must exceed)"
)


class Compression(BaseModel):
    """What workers send (the ``compress`` option): ``none``, ``sparse``, ``fp16``, ``topk:F`` or ``significance:V``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "sparse", "fp16", "topk", "significance"] = "none"
    value: float | None = None

    @model_validator(mode="after")
    def _value_fits(self) -> Compression:
        if self.kind in ("none", "sparse", "fp16"):
            if self.value is not None:
                raise ValueError(f"{self.kind} takes no value")
        elif self.value is None:
            raise ValueError(f"{self.kind} needs a value, {self.kind}:{'F' if self.kind == 'topk' else 'V'}")
        elif not math.isfinite(self.value):
            raise ValueError(f"{self.kind}'s value must be a finite number, not {self.value}")
        elif self.kind == "topk" and not 0 < self.value <= 1:
            raise ValueError(f"topk's fraction must be in (0, 1], not {self.value:g}")
        elif self.kind == "significance" and not self.value > 0:
            raise ValueError(f"significance's threshold must be above 0, not {self.value:g}")
        return self

    @classmethod
    def parse(cls, text: str) -> Compression:
        """``"topk:0.01"`` → Compression(kind="topk", value=0.01); a ValueError that names the option and its forms
        (as a TrainingSpec field's error, after the field's name or flag)."""
        kind, _, value = text.strip().lower().partition(":")
        try:
            return cls(kind=kind, value=float(value) if value else None)
        except ValueError as error:  # a pydantic ValidationError is one too
            problems = getattr(error, "errors", None)
            why = "; ".join(e["msg"].removeprefix("Value error, ") for e in problems()) if problems else str(error)
            if kind not in ("none", "sparse", "fp16", "topk", "significance"):
                why = f"{kind!r} is no compressor"
            elif value and not _is_number(value):
                why = f"{value!r} is not a number"
            raise ValueError(f"{text!r}: {why}; compress takes {COMPRESS_FORMS}") from None

    @property
    def sparse(self) -> bool:
        """Whether an update sends some of its entries only (top-k, significance): a step of the reducers' optimizer
        then sees each entry now and then, with what it gathered meanwhile (not ``sparse``, which leaves out zeros
        only: every step sees every entry, as dense)."""
        return self.kind in ("topk", "significance")

    @property
    def encoding(self) -> int:
        return {"none": DENSE_F32, "sparse": SPARSE, "fp16": DENSE_F16, "topk": TOP_K, "significance": SIGNIFICANCE}[
            self.kind
        ]

    @property
    def tabled(self) -> bool:
        """Whether an update's parts vary in size (significance, sparse): a part table says where each lies."""
        return self.kind in ("significance", "sparse")

    @property
    def lossy(self) -> bool:
        """Whether the reducers get less than the update (then the worker keeps a residual)."""
        return self.kind not in ("none", "sparse")

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


NONE = Compression()
