"""A function's warm containers, each one process of its own (a single-worker ``ProcessPoolExecutor``): one that
dies (killed past its memory, crashed) ends only the invocation it ran, and a fresh container takes its place for
the next invocations, as Lambda replaces a container that died and leaves its others running."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

Container = ProcessPoolExecutor  # of one process, started with its first call


class Containers:
    """``size`` containers made by ``new`` (each process started when it is first called); a call waits, in turn,
    for a free one. ``on_replaced`` is called for each container replaced after its process died."""

    def __init__(self, size: int, new: Callable[[], Container], on_replaced: Callable[[], None]) -> None:
        self._new = new
        self._on_replaced = on_replaced
        self._idle: deque[Container] = deque(new() for _ in range(size))
        self._busy: set[Container] = set()
        self._stale: set[Container] = set()  # busy ones to replace once their call ends (``renew``)
        self._waiting: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._closed = False
        self._lock = threading.Lock()

    def start(self, ready: Callable[[], Any]) -> list[Future[Any]]:
        """Start every container's process: ``ready()`` runs once in each (its futures)."""
        with self._lock:
            return [container.submit(ready) for container in self._idle]

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """``fn(*args)`` in the first container free; RuntimeError once closed."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the function's containers are shut down")
            self._waiting.append((future, fn, args))
        self._assign()
        return future

    def renew(self) -> None:
        """Replace every container by a fresh one from ``new``: the free ones now, the busy ones once their call
        ended (as a deployment's update starts fresh containers and lets those running finish)."""
        with self._lock:
            if self._closed:
                return
            for container in self._idle:
                container.shutdown(wait=False)
            self._idle = deque(self._new() for _ in self._idle)
            self._stale |= self._busy
        self._assign()

    def close(self) -> None:
        """Start no more calls: those waiting are cancelled, those running end in their processes."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, deque()
            for container in (*self._idle, *self._busy):
                container.shutdown(wait=False)
        for future, _, _ in waiting:
            future.cancel()

    def _assign(self) -> None:
        """Hand the calls waiting to the free containers."""
        while True:
            with self._lock:
                if self._closed or not self._idle or not self._waiting:
                    return
                future, fn, args = self._waiting.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                container = self._idle.popleft()
                try:
                    running = container.submit(fn, *args)
                except BrokenProcessPool:  # its process died while it was free
                    container.shutdown(wait=False)
                    self._on_replaced()
                    container = self._new()
                    running = container.submit(fn, *args)
                self._busy.add(container)
            running.add_done_callback(partial(self._ended, container, future))

    def _ended(self, container: Container, future: Future[Any], running: Future[Any]) -> None:
        """A call ended: its container is free again (a fresh one if its process died or it was renewed)."""
        error = running.exception()
        died = isinstance(error, BrokenProcessPool)
        with self._lock:
            self._busy.discard(container)
            if died or container in self._stale or self._closed:
                self._stale.discard(container)
                container.shutdown(wait=False)
                if not self._closed:
                    self._idle.append(self._new())
            else:
                self._idle.append(container)
        if died:
            self._on_replaced()
        self._assign()
        if error is None:
            future.set_result(running.result())
        else:
            future.set_exception(error)
