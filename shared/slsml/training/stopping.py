"""Keras's EarlyStopping and ModelCheckpoint(save_best_only) as decisions over a run's evaluations: the figures of
a monitored metric, one per evaluation in order (``val_`` at each epoch's end, ``test_`` every ``eval_every``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Mode = Literal["min", "max"]


def _improves(current: float, best: float | None, mode: Mode, min_delta: float) -> bool:
    """Keras's ``_is_improvement``: better than ``best`` by more than ``min_delta``."""
    if best is None:
        return True
    return current - abs(min_delta) > best if mode == "max" else current + abs(min_delta) < best


def stopped_at(values: Sequence[float], mode: Mode, patience: int, min_delta: float) -> int | None:
    """The evaluation after which EarlyStopping stops (its epoch), None if it does not within ``values``."""
    best: float | None = None
    wait = 0
    for epoch, current in enumerate(values):
        wait += 1
        if _improves(current, best, mode, min_delta):
            best, wait = current, 0
            continue
        if wait >= patience and epoch > 0:
            return epoch
    return None


def best_at(values: Sequence[float], mode: Mode) -> int:
    """The evaluation ModelCheckpoint(save_best_only) keeps: the first of the best."""
    best: float | None = None
    found = 0
    for epoch, current in enumerate(values):
        if _improves(current, best, mode, 0.0):
            best, found = current, epoch
    return found
