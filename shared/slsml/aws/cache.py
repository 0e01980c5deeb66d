"""What a warm container keeps between invocations (run configs, models, dataset shards), in one LRU
cache bounded by bytes, so that a container serving run after run stays within its memory.

The bound is ``SLSML_WARM_CACHE_MB`` if set, else ``MEMORY_SHARE`` of the function's memory
(``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``, set by Lambda and by the local host). The rest of the memory holds
the runtime (TensorFlow alone takes about 640 MB) and an invocation's working set (the weights read,
their gradient, the update written: a few times the model's bytes).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, TypeVar

from slsml.spec.deployment import FunctionSettings
from slsml.spec.wiring import MEMORY_ENV

BOUND_ENV = "SLSML_WARM_CACHE_MB"
MEMORY_SHARE = 0.5
# A parsed pydantic model (a run config, a dataset manifest) takes about 9× the bytes of its JSON
# (tracemalloc, configs of 4 to 400 variables).
PARSED_BYTES_PER_JSON_BYTE = 10

V = TypeVar("V")


class LRUCache:
    """Entries with their size in bytes. Past ``limit`` bytes the least recently used go first; an entry
    bigger than ``limit`` is not kept. ``limit=None``: no bound."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.nbytes = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def bound(self, limit: int | None) -> None:
        """Bound the cache by ``limit`` bytes from now on, evicting the least recently used past it."""
        self.limit = limit
        if limit is not None:
            self._evict_to(limit)

    def put(self, key: Hashable, value: V, nbytes: int) -> V:
        """Keep ``value`` (``nbytes`` large) under ``key``, making room; returns ``value``."""
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.nbytes -= previous[1]
        if self.limit is not None and nbytes > self.limit:
            return value
        if self.limit is not None:
            self._evict_to(self.limit - nbytes)
        self._entries[key] = (value, nbytes)
        self.nbytes += nbytes
        return value

    def _evict_to(self, nbytes: int) -> None:
        while self._entries and self.nbytes > nbytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.nbytes -= evicted


def limit_bytes() -> int:
    """This process's bound: ``SLSML_WARM_CACHE_MB``, else ``MEMORY_SHARE`` of the function's memory
    (outside a function: of a function's default memory)."""
    if os.environ.get(BOUND_ENV):
        return int(float(os.environ[BOUND_ENV]) * 2**20)
    memory_mb = int(os.environ.get(MEMORY_ENV) or FunctionSettings().memory_mb)
    return int(MEMORY_SHARE * memory_mb * 2**20)


_warm: LRUCache | None = None


def warm() -> LRUCache:
    """The process's warm cache, bounded by ``limit_bytes()`` as of this use (an invocation may set another
    ``SLSML_WARM_CACHE_MB``)."""
    global _warm
    if _warm is None:
        _warm = LRUCache(limit_bytes())
    elif _warm.limit != (limit := limit_bytes()):
        _warm.bound(limit)
    return _warm
