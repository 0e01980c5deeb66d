"""The accuracy floors (``floors``) of the update rules and compressions that send dense updates."""

from __future__ import annotations

import pytest

from . import floors


@pytest.fixture(scope="module")
def accuracies(services, digits) -> dict[str, float | None]:
    return floors.accuracies(services, floors.DENSE)


@pytest.mark.parametrize("case", floors.DENSE)
def test_each_rule_and_compression_trains_within_a_point_of_its_floor(accuracies, case):
    floors.check_floor(accuracies, case)
