"""A search's settings as the unit tests make them."""

from __future__ import annotations

import time

from slsml.search.records import SearchSettings


def search_settings(**changes) -> SearchSettings:
    """The settings of a search ``cancer`` (8 trials, 4 at a time, 6 epochs, ``val_auc`` the higher the better), with
    ``changes``."""
    fields = dict(
        name="cancer",
        dataset="cancer",
        validation="test",
        objective="val_auc",
        direction="max",
        max_trials=8,
        parallel=4,
        epochs=6,
        batch_size=64,
        started_at=time.time(),
    )
    return SearchSettings(**(fields | changes))
