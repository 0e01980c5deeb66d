"""The models a worker's rounds enter, kept in the warm cache (``slsml.aws.cache``) and, under ``stale_weights``,
fetched ahead: a round one ahead enters the model before the one being merged, so the model its next round enters is
merged while it computes. The worker looks for that model's manifest every ``POLL_S`` (a HeadObject) from the start
of its round until its invocation ends, and reads it (its proofs checked as ever) as soon as it is there; the next
round takes it from the warm cache, and the model the round before entered too (a predicted round reads two).

What it holds: two models' float32 weights at most, entries of the warm cache within its bound (the model a round
entered and the one its next round enters), and, while a read ahead is under way, its shards' bytes and the vector
they are decoded into (``sizing.AHEAD_COPIES``, counted beside the step). A model is kept by run, generation and
iteration: a resumed run (a new generation) reads its own.

A worker's invocation goes on to its next round once the model that round enters is merged, while it has
``GO_ON_ROUNDS`` rounds' time left (``slsml.pipeline.steps.worker.going_on``); the plan counts those rounds
(``slsml.cost.predict.going_on``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import numpy as np
from aws_lambda_powertools import Logger

from slsml.aws import cache

logger = Logger(child=True)
POLL_S = 0.05  # how often a worker looks for the next model's manifest while its round computes
# a worker's invocation goes on to its next round while it has this many rounds' time left (slsml.pipeline.steps.worker)
GO_ON_ROUNDS = 2.0
_pending: dict[Hashable, threading.Thread] = {}  # reads under way, by the key their model lands at


def weights(key: Hashable, read: Callable[[], np.ndarray], keep: bool) -> np.ndarray:
    """The model at ``key`` (the caller's to change): the warm one (a read ahead under way is waited for), else
    ``read()`` now, and kept warm where ``keep`` (a run on stale weights, whose next round enters it again)."""
    reading = _pending.get(key)
    if reading is not None:
        reading.join()  # the read this round would make, begun earlier
    held = cache.warm().get(key)
    if held is not None:
        return held.copy()
    return _keep(key, read()).copy() if keep else read()


def _keep(key: Hashable, flat: np.ndarray) -> np.ndarray:
    flat.setflags(write=False)
    return cache.warm().put(key, flat, flat.nbytes)


class Ahead:
    """The read of the model a worker's next round enters (at ``key``), under way while this round computes: started
    with the round where ``wanted``, it looks for the model's manifest (``stored()``) every ``POLL_S`` until ``stop``
    (the invocation's end), then ``read()``s the model into the warm cache. Use it as a context manager. ``polls``:
    the looks it took."""

    def __init__(self, key: Hashable, stored: Callable[[], bool], read: Callable[[], np.ndarray], wanted: bool) -> None:
        self.key, self.polls = key, 0
        self._stored, self._read = stored, read
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        if wanted and key not in _pending and cache.warm().get(key) is None:
            self.thread = threading.Thread(target=self._run, name="model-ahead", daemon=True)
            _pending[key] = self.thread
            self.thread.start()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop looking for the manifest (a read begun goes on, and lands in the warm cache)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.polls += 1
                if self._stored():
                    _keep(self.key, self._read())
                    return
                self._stop.wait(POLL_S)
        except Exception as error:  # the next round reads the model itself, and fails there if it must
            logger.info("model not read ahead", extra={"key": repr(self.key), "error": str(error)})
        finally:
            _pending.pop(self.key, None)
