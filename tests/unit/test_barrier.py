"""Quorum counting of relaxed barriers."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from slsml.state.barrier import quorum_count


@pytest.mark.parametrize(
    ("total", "quorum", "expected"),
    [(10, 1.0, 10), (1, 1.0, 1), (37, 1, 37), (10, 0.9, 9), (8, 7 / 8, 7), (10, 0.95, 10), (3, 0.5, 2), (100, 0.01, 1)],
)
def test_examples(total: int, quorum: float, expected: int) -> None:
    assert quorum_count(total, quorum) == expected


def test_is_the_exact_ceiling_of_the_decimal_quorum() -> None:
    """⌈q·W⌉ with q the decimal the user typed, not its binary float (0.07·100 is 7.000000000000001 in floats)."""
    assert quorum_count(100, 0.07) == 7 and quorum_count(25, 0.28) == 7 and quorum_count(100, 0.55) == 55
    for percent in range(1, 101):
        quorum = f"{percent / 100:.2f}"
        for total in range(1, 1001):
            expected = max(1, math.ceil(Fraction(quorum) * total))
            assert quorum_count(total, float(quorum)) == expected, f"W={total}, q={quorum}"


def test_at_least_one() -> None:
    assert quorum_count(1, 0.01) == 1
    assert quorum_count(0, 0.5) == 1
    assert all(1 <= quorum_count(w, 1e-6) <= w for w in range(1, 50))


@pytest.mark.parametrize("quorum", [0, 0.0, -0.5, 1.0000001, 2, float("nan"), float("inf")])
def test_invalid_quorum(quorum: float) -> None:
    with pytest.raises(ValueError, match="quorum"):
        quorum_count(10, quorum)
