"""Steps a Ctrl-C must not cut in two: the signal is held while the step runs, and handled as it ends."""

from __future__ import annotations

import os
import signal
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager

HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def held_until_done(signums: tuple[signal.Signals, ...] = HELD) -> Iterator[None]:
    """Run the block whole: a first ``signums`` arriving meanwhile is handled as the block ends (by the handler it
    replaced), a second at once, as a second Ctrl-C ends a command at once. Outside the main thread, where Python
    delivers no signal, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signums}
    arrived: list[signal.Signals] = []

    def hold(signum: int, frame: types.FrameType | None) -> None:
        if arrived:
            signal.signal(signum, previous[signal.Signals(signum)])
            _handle(signal.Signals(signum), previous[signal.Signals(signum)], frame)
        arrived.append(signal.Signals(signum))

    for signum in signums:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if arrived:
            _handle(arrived[0], previous[arrived[0]], None)


def _handle(signum: signal.Signals, handler: object, frame: types.FrameType | None) -> None:
    """Handle ``signum`` as ``handler`` (what ``signal.getsignal`` answered) would have."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # the handler is restored: the default action, now
