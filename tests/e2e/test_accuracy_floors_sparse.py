"""The accuracy floors (``floors``) of the update rules and compressions that send sparse updates."""

from __future__ import annotations

import pytest

from slsml.state.records import RunRecord

from . import floors


@pytest.fixture(scope="module")
def ended(services, digits) -> dict[str, RunRecord]:
    return floors.completed(services, floors.SPARSE)


@pytest.mark.parametrize("case", floors.SPARSE)
def test_each_rule_and_compression_trains_within_a_point_of_its_floor(ended, case):
    floors.check_floor(ended, case)
