"""Relaxed barriers: a stage fires once a quorum of its inputs is in, not when all are; under ASP (``staleness
unbounded``) none: each update is applied alone, and launched by the model version its worker's last one made."""

from __future__ import annotations

import math


def quorum_count(total: int, quorum: float) -> int:
    """How many of ``total`` inputs a barrier with fraction ``quorum`` waits for: ⌈q·total⌉, at least 1."""
    if not 0 < quorum <= 1:
        raise ValueError(f"quorum must be in (0, 1], got {quorum}")
    # round first so that 0.9 * 10 counts as 9, not 9.000000000000002 → 10
    return max(1, math.ceil(round(quorum * total, 9)))


def asynchronous_update(iteration: int, worker: int, workers: int) -> int:
    """ASP (``staleness unbounded``): the number of the update ``worker`` computes on the model of ``iteration``.
    Each model version applies one update and launches its worker again: the first ``workers`` updates are launched
    on version 0, the one launched on version i > 0 is update i + workers − 1; a run of n iterations launches the
    updates below n."""
    return worker if iteration == 0 else iteration + workers - 1
