"""Relaxed barriers: a stage fires once a quorum of its inputs is in, not when all are; under ASP (``staleness
unbounded``) none: a version applies every update waiting when its reduce fires, and launches their workers again."""

from __future__ import annotations

import math


def quorum_count(total: int, quorum: float) -> int:
    """How many of ``total`` inputs a barrier with fraction ``quorum`` waits for: ⌈q·total⌉, at least 1."""
    if not 0 < quorum <= 1:
        raise ValueError(f"quorum must be in (0, 1], got {quorum}")
    # round first so that 0.9 * 10 counts as 9, not 9.000000000000002 → 10
    return max(1, math.ceil(round(quorum * total, 9)))


def next_version(iteration: int, updates: int, asynchronous: bool) -> int:
    """The model version a reduce of ``iteration`` applying ``updates`` makes: the next one, or under ASP the one
    ``updates`` later (a version is numbered by the updates applied before it)."""
    return iteration + (updates if asynchronous else 1)


def asynchronous_updates(iteration: int, freed: list[int], workers: int, budget: int) -> dict[int, int]:
    """ASP (``staleness unbounded``): worker → the number of the update it computes on model version ``iteration``,
    for ``freed``, the workers launched on it (all of them on version 0, else those whose updates made it). Updates
    are numbered in launch order, ``workers`` in flight: ``iteration`` were applied before the version, so
    ``iteration + workers − len(freed)`` were launched before its; none at or past ``budget`` (the run's iterations)
    is launched."""
    first = iteration + workers - len(freed)
    return {w: n for n, w in enumerate(sorted(freed), start=first) if n < budget}
