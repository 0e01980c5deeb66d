"""Relaxed barriers: a stage fires once a quorum of its inputs is in, not when all are."""

from __future__ import annotations

import math


def quorum_count(total: int, quorum: float) -> int:
    """How many of ``total`` inputs a barrier with fraction ``quorum`` waits for: ⌈q·total⌉, at least 1."""
    if not 0 < quorum <= 1:
        raise ValueError(f"quorum must be in (0, 1], got {quorum}")
    # round first so that 0.9 * 10 counts as 9, not 9.000000000000002 → 10
    return max(1, math.ceil(round(quorum * total, 9)))
