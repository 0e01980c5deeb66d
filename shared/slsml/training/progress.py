"""A worker's round handed on between invocations of the same attempt: when an invocation's time runs short
before a micro-batch, the round stores its progress (``Progress``: local steps done, the local weights and the local
optimizer's state after them, the steps' losses and the state of their metrics, and the micro-batches of the step under
way added up so far, ``Partial``) create-only, and a fresh invocation goes on from it with the round's remaining
micro-batches. What it computes is what the uninterrupted round computes, in the same order from the same values, so the
round ends bit-identical.

``Pacer`` decides when: before each micro-batch but the invocation's first (each invocation computes one at least),
it hands on once the time left is below ``reserve_s``: twice the longest micro-batch so far, storing the progress at
the function's S3 bandwidth, and ``PAUSE_RESERVE_S`` for the requests and the message that hand the round on. The
plan (``slsml.cost.workerround``) counts invocations per round with the same rule."""

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
_PARTIAL = "partial."  # prefix of the step under way's arrays


@dataclass(frozen=True)
class Partial:
    """A step's update after its first ``done`` micro-batches: each one's update weighted by its share of the step's
    samples, summed in float64 (``slsml.rounds.accumulate``)."""

    done: int
    vector: np.ndarray  # float64, in plan order: gradients of trainable weights, values of the others
    loss: float  # the micro-batches' losses, each weighted by its share
    metrics: np.ndarray | None  # the state of their metrics, summed (None: not tracked)


@dataclass(frozen=True)
class Progress:
    """A round after ``steps`` local steps and, of the next, the micro-batches of ``partial``."""

    steps: int
    # flat float32, in plan order: trainable ones stepped, the others after the last forward pass; empty for a round
    # that takes no local step (gradient averaging: its one step's gradient is the update)
    weights: np.ndarray
    state: State  # the local optimizer's
    losses: tuple[float, ...]  # each step's
    metrics: np.ndarray | None  # the state of the steps' metrics, summed (None: not tracked)
    compute_s: float = 0.0  # the steps' compute, over the invocations so far
    partial: Partial | None = None  # the step under way (None: none begun)

    @property
    def micro_batches(self) -> int:
        """Micro-batches of the step under way already added up."""
        return 0 if self.partial is None else self.partial.done

    @property
    def loss(self) -> float:
        """The mean loss over the steps."""
        return float(np.mean(self.losses))

    def encode(self) -> bytes:
        partial = self.partial
        return npz.encode(
            steps=np.asarray(self.steps, dtype=np.int64),
            weights=self.weights,
            losses=np.asarray(self.losses, dtype=np.float64),
            metrics=_optional(self.metrics),
            compute_s=np.asarray(self.compute_s, dtype=np.float64),
            **{_STATE + name: value for name, value in self.state.items()},
            **(
                {}
                if partial is None
                else {
                    _PARTIAL + "done": np.asarray(partial.done, dtype=np.int64),
                    _PARTIAL + "vector": np.asarray(partial.vector, dtype=np.float64),
                    _PARTIAL + "loss": np.asarray(partial.loss, dtype=np.float64),
                    _PARTIAL + "metrics": _optional(partial.metrics),
                }
            ),
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
        if weights.shape not in {(size,), (0,)} or weights.dtype != np.float32:
            raise BadInputError(
                f"{where}: a round's progress holds {size} float32 weights (or none), not {weights.shape}"
                f" {weights.dtype}"
            )
        partial = None
        if _PARTIAL + "done" in arrays:
            vector = arrays.get(_PARTIAL + "vector")
            if vector is None or vector.shape != (size,) or vector.dtype != np.float64:
                raise BadInputError(f"{where}: a step's micro-batches add up to {size} float64 values")
            found = arrays.get(_PARTIAL + "metrics", np.zeros(0))
            partial = Partial(
                int(arrays[_PARTIAL + "done"]), vector, float(arrays[_PARTIAL + "loss"]), found if found.size else None
            )
        return cls(
            steps=int(arrays["steps"]),
            weights=weights,
            state={name[len(_STATE) :]: value for name, value in arrays.items() if name.startswith(_STATE)},
            losses=tuple(float(v) for v in arrays["losses"]),
            metrics=arrays["metrics"] if arrays["metrics"].size else None,
            compute_s=float(arrays["compute_s"]),
            partial=partial,
        )


def _optional(values: np.ndarray | None) -> np.ndarray:
    """Values as stored: float64, empty for none."""
    return np.zeros(0) if values is None else np.asarray(values, dtype=np.float64)


def stored_bytes(
    params: int,
    trainable: int,
    optimizer: OptimizerConfig,
    steps: int,
    metric_values: int,
    local_weights: bool = True,
    partial: bool = False,
) -> int:
    """Bytes of the progress of a round of ``steps`` steps of ``optimizer`` on a model of ``params`` float32 weights,
    ``trainable`` of them trainable, whose metrics' state holds ``metric_values`` values, without building it:
    ``local_weights``, a round of local steps (their weights stored); ``partial``, with a step's micro-batches under
    way (their float64 sum stored)."""
    empty, grown = _template(optimizer)
    kept = 4 * params if local_weights else 0
    under_way = _PARTIAL_BYTES + 8 * params + 8 * metric_values if partial else 0
    return empty + kept + grown * trainable + 8 * steps + 8 * metric_values + under_way


# what a step under way adds to the archive beyond its values: four entries' headers and its count and loss
_PARTIAL_BYTES = len(
    Progress(0, np.zeros(0, np.float32), {}, (), None, partial=Partial(0, np.zeros(0), 0.0, None)).encode()
) - len(Progress(0, np.zeros(0, np.float32), {}, (), None).encode())


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
    """Whether the round hands on before its next micro-batch (``pause``: called before each one), from the time its
    invocation has left (``remaining_s``) and the longest micro-batch it has computed."""

    def __init__(self, remaining_s: Callable[[], float], progress_bytes: int) -> None:
        self.remaining_s, self.progress_bytes = remaining_s, progress_bytes
        self.longest_s = 0.0
        self._began: float | None = None

    def pause(self) -> bool:
        """Before a micro-batch: True if the invocation must hand the round on instead (never before its first)."""
        now = time.perf_counter()
        if self._began is None:
            self._began = now
            return False
        self.longest_s, self._began = max(self.longest_s, now - self._began), now
        return self.remaining_s() < reserve_s(self.progress_bytes, self.longest_s)


def never() -> bool:
    """A round that never hands on (one run in a single invocation, as a test or a tool runs it)."""
    return False
