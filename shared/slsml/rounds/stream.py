"""A worker's round as a stream of micro-batches: each step's batch (the worker's share of one global batch) cut
into micro-batches (``accumulate.sizes``), read in order by a few threads ahead of the one computing, so that the
samples of micro-batch k+1 arrive while k computes and no more than ``AHEAD`` micro-batches wait in memory. What
the stream saw (its reads' seconds, and how long compute waited for them) is its ``Timing``."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from slsml.rounds.accumulate import sizes
from slsml.training.weighting import Batch

AHEAD = 2  # micro-batches read ahead of the one computing


@dataclass(frozen=True)
class Timing:
    """What a round's stream saw: its micro-batches, their reads' seconds added up, and the seconds compute waited
    for a read (the rest of the reading overlapped compute)."""

    micro_batches: int
    read_s: float
    waited_s: float


class Step(Sequence[Batch]):
    """One step's batch of ``samples`` samples, as its micro-batches (those left, in a round handed on)."""

    def __init__(self, stream: Stream, first: int, count: int, samples: int) -> None:
        self._stream, self._first, self._count, self.samples = stream, first, count, samples

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Batch: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Batch]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        return self._stream.take(self._first + index % self._count)

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(self._count))


class Stream:
    """The micro-batches of a round's steps (``batches``: each step's sample indices), ``micro_batch`` samples at
    most each (as even as can be, or, not ``even``, that many each but the last: an evaluation's batches), the first
    step's first ``skip`` left out (a round handed on after them); ``read(indices)`` reads one. Use it as a context
    manager: its reads stop with it. ``then``, where set, runs on a reading thread once the last micro-batch is taken
    (the reads of a round to follow begin)."""

    def __init__(
        self,
        read: Callable[[np.ndarray], Batch],
        batches: Sequence[np.ndarray],
        micro_batch: int,
        skip: int = 0,
        even: bool = True,
    ) -> None:
        self._read = read
        parts: list[np.ndarray] = []
        self.steps: list[Step] = []
        for number, indices in enumerate(batches):
            whole, rest = divmod(len(indices), micro_batch)
            cuts = np.cumsum(
                [0, *(sizes(len(indices), micro_batch) if even else [micro_batch] * whole + [rest] * bool(rest))]
            )
            mine = [indices[a:b] for a, b in itertools.pairwise(cuts)][skip if number == 0 else 0 :]
            self.steps.append(Step(self, len(parts), len(mine), len(indices)))
            parts.extend(mine)
        self._parts = parts
        self._reads: list[Future[tuple[Batch, float]] | None] = [None] * len(parts)
        self._pool = ThreadPoolExecutor(max_workers=AHEAD, thread_name_prefix="micro-batch")
        self._lock = threading.Lock()
        self._read_s = self._waited_s = 0.0
        self._kept = 0  # micro-batches taken so far: those before the last one taken are let go
        self.then: Callable[[], object] | None = None  # run (by a reading thread) as the last micro-batch is taken
        self._submit_through(AHEAD - 1)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *_: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def take(self, number: int) -> Batch:
        """Micro-batch ``number`` of the round, once read; the reads after it up to ``AHEAD`` are started, and the
        ones before it are let go (a round takes its micro-batches in order)."""
        self._submit_through(number + AHEAD)
        read = self._reads[number]
        if read is None:
            raise IndexError(f"micro-batch {number} was let go: a round takes its micro-batches in order")
        started = time.perf_counter()
        batch, seconds = read.result()
        with self._lock:
            for before in range(self._kept, number):
                self._reads[before] = None
            if number >= self._kept:  # its first take: timed
                self._waited_s += time.perf_counter() - started
                self._read_s += seconds
                self._kept = number + 1
                if self._kept == len(self._parts) and self.then is not None:
                    self._pool.submit(self.then)
        return batch

    def timing(self) -> Timing:
        with self._lock:
            return Timing(len(self._parts), self._read_s, self._waited_s)

    def _submit_through(self, last: int) -> None:
        with self._lock:
            for number in range(max(0, self._kept - 1), min(last + 1, len(self._parts))):
                if self._reads[number] is None:
                    self._reads[number] = self._pool.submit(self._timed, self._parts[number])

    def _timed(self, indices: np.ndarray) -> tuple[Batch, float]:
        started = time.perf_counter()
        return self._read(indices), time.perf_counter() - started
