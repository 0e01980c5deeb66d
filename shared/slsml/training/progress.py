"""A worker's round handed on between invocations of the same attempt: when an invocation's time runs short
before a local step, the round stores its progress (``Progress``: local steps done, the local weights and the local
optimizer's state after them, the steps' losses and the state of their metrics) create-only, and a fresh invocation goes
on from it with the round's remaining batches. The steps it takes are the ones the uninterrupted round takes, in the
same order from the same values, so the round ends bit-identical.

``Pacer`` decides when: before each step but the invocation's first (each invocation takes one at least), it
hands on once the time left is below ``reserve_s``: twice the longest step so far, storing the progress at the
function's S3 bandwidth, and ``PAUSE_RESERVE_S`` for the requests and the message that hand the round on. The
plan (``slsml.cost.model``) counts invocations per round with the same rule."""

from __future__ import annotations

import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from slsml.spec.config import OptimizerConfig
from slsml.spec.errors import BadInputError
from slsml.training import npz, optimizers
from slsml.training.optimizers import State

PAUSE_RESERVE_S = 5.0  # store the progress's request, record the hand-on, publish it; a margin besides
WRITE_MB_S = 65.0  # one function's S3 write bandwidth (the plan's s3_write_mb_s)
_STATE = "state."  # prefix of the optimizer state's arrays in the archive


@dataclass(frozen=True)
class Progress:
    """A round after ``steps`` local steps."""

    steps: int
    weights: np.ndarray  # flat float32, in plan order: trainable ones stepped, the others after the last forward pass
    state: State  # the local optimizer's
    losses: tuple[float, ...]  # each step's
    metrics: np.ndarray | None  # the state of the steps' metrics, summed (None: not tracked)
    compute_s: float = 0.0  # the steps' compute, over the invocations so far

    @property
    def loss(self) -> float:
        """The mean loss over the steps."""
        return float(np.mean(self.losses))

    def encode(self) -> bytes:
        return npz.encode(
            steps=np.asarray(self.steps, dtype=np.int64),
            weights=self.weights,
            losses=np.asarray(self.losses, dtype=np.float64),
            metrics=np.zeros(0) if self.metrics is None else np.asarray(self.metrics, dtype=np.float64),
            compute_s=np.asarray(self.compute_s, dtype=np.float64),
            **{_STATE + name: value for name, value in self.state.items()},
        )

    @classmethod
    def decode(cls, body: bytes, size: int, where: str) -> Progress:
        """Stored progress → the progress; BadInputError naming ``where`` unless it holds a round's progress of a
        model of ``size`` float32 weights."""
        try:
            arrays = npz.decode(body)
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            raise BadInputError(f"{where}: not a round's progress ({error})") from None
        missing = [name for name in ("steps", "weights", "losses", "metrics", "compute_s") if name not in arrays]
        if missing:
            raise BadInputError(f"{where}: a round's progress without {', '.join(missing)}")
        weights = arrays["weights"]
        if weights.shape != (size,) or weights.dtype != np.float32:
            raise BadInputError(
                f"{where}: a round's progress holds {size} float32 weights, not {weights.shape} {weights.dtype}"
            )
        return cls(
            steps=int(arrays["steps"]),
            weights=weights,
            state={name[len(_STATE) :]: value for name, value in arrays.items() if name.startswith(_STATE)},
            losses=tuple(float(v) for v in arrays["losses"]),
            metrics=arrays["metrics"] if arrays["metrics"].size else None,
            compute_s=float(arrays["compute_s"]),
        )


def stored_bytes(params: int, trainable: int, optimizer: OptimizerConfig, steps: int, metric_values: int) -> int:
    """Bytes of the progress of a round of ``steps`` steps of ``optimizer`` on a model of ``params`` float32 weights,
    ``trainable`` of them trainable, whose metrics' state holds ``metric_values`` values, without building it."""
    empty, grown = _template(optimizer)
    return empty + 4 * params + grown * trainable + 8 * steps + 8 * metric_values


@cache
def _template(optimizer: OptimizerConfig) -> tuple[int, int]:
    """The bytes of an empty progress of ``optimizer``, and its state's bytes per trainable weight."""
    template = Progress(0, np.zeros(0, np.float32), optimizers.initial_state(optimizer, 0), (), None)
    return len(template.encode()), sum(value.dtype.itemsize for value in template.state.values() if value.ndim == 1)


def reserve_s(progress_bytes: int, step_s: float, write_mb_s: float = WRITE_MB_S) -> float:
    """The time an invocation keeps for handing its round on: another step (twice the longest so far), storing
    its progress, the requests and message that hand it on."""
    return PAUSE_RESERVE_S + 2 * step_s + progress_bytes / (write_mb_s * 1e6)


class Pacer:
    """Whether the round hands on before its next step (``pause``), from the time its invocation has left
    (``remaining_s``) and the longest step it has taken (``step``: called before each step)."""

    def __init__(self, remaining_s: Callable[[], float], progress_bytes: int) -> None:
        self.remaining_s, self.progress_bytes = remaining_s, progress_bytes
        self.longest_s = 0.0
        self._began: float | None = None

    def pause(self) -> bool:
        """Before a step: True if the invocation must hand the round on instead (never before its first step)."""
        now = time.perf_counter()
        if self._began is None:
            self._began = now
            return False
        self.longest_s, self._began = max(self.longest_s, now - self._began), now
        return self.remaining_s() < reserve_s(self.progress_bytes, self.longest_s)


def never() -> bool:
    """A round that never hands on (one run in a single invocation, as a test or a tool runs it)."""
    return False
