"""Every test's local service state in a folder of the session's own, never the user's home: the local service is
found through the user's state directory ($XDG_STATE_HOME), which the commands the tests run inherit; and
each test's AWS clients its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slsml.aws import clients
from slsml.local.service import STATE_HOME_ENV


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv(STATE_HOME_ENV, str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(autouse=True)
def fresh_clients() -> None:
    """Each test's AWS clients are made with the credentials its own cloud sets: none kept from a test that made
    them before any were set (a client takes the session's credentials as it is made)."""
    clients._client.cache_clear()
    clients._resource.cache_clear()
