"""How long the invocation running a step has left, from Lambda's context (the local host hands its functions the
same context, and ends an invocation at its function's timeout as Lambda does): a step whose work may outlast
its invocation (a worker's round) hands it on to a fresh invocation before the timeout ends it."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# (when the invocation ends on time.monotonic()'s clock, its whole time as it began)
_INVOCATION: ContextVar[tuple[float, float] | None] = ContextVar("invocation", default=None)


@contextmanager
def invocation(context: Any) -> Iterator[None]:
    """The steps run inside see the time ``context`` (a Lambda context) gives the invocation."""
    lifetime = context.get_remaining_time_in_millis() / 1000
    token = _INVOCATION.set((time.monotonic() + lifetime, lifetime))
    try:
        yield
    finally:
        _INVOCATION.reset(token)


def remaining_s() -> float:
    """Seconds until the invocation is ended (infinite outside one)."""
    found = _INVOCATION.get()
    return math.inf if found is None else found[0] - time.monotonic()


def lifetime_s() -> float:
    """The invocation's whole time, as a fresh invocation of the same function has it (infinite outside one)."""
    found = _INVOCATION.get()
    return math.inf if found is None else found[1]


def current() -> object | None:
    """The invocation running (a token of its own: another invocation's is not equal to it; None outside one)."""
    return _INVOCATION.get()
