"""A warm process's memory as Lambda counts its container's: the resident set (``psutil``: on Linux one read of
``/proc/PID/statm``), and its peak over an invocation (Linux's ``VmHWM``, reset when the invocation starts), in MB as
Lambda's REPORT line gives them.

A warm process is forked from the server that imported the functions' libraries (``slsml.local.preload``), so its
resident set holds what it touched of them, not what a container holds once it imported them: a process counts its
resident set less what it held when forked, plus what a container of its function holds after its imports (the
preload's figures: TensorFlow's for a TensorFlow function, the libraries' alone for the others). Where there is no
fork server (Windows), a process imports its libraries itself and its whole resident set counts. The peak is read
on Linux alone: elsewhere ``peak_bytes`` has none, and the REPORT line gives no peak.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import NamedTuple

import psutil

MB = 2**20  # Lambda's MB: a function's memory_mb is this many bytes
POLL_S = 0.05  # how often the host reads the resident set of each process running an invocation
_PEAK_KEPT = Path("/proc/self/clear_refs").exists()  # Linux: VmHWM, which clear_refs resets


def resident_bytes(pid: int | None = None) -> int | None:
    """The resident set of process ``pid`` (default: this one), or None once it has ended."""
    try:
        return _resident(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return None


def _resident(process: psutil.Process) -> int | None:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return None


def reset_peak() -> None:
    """Start this process's peak resident set (``VmHWM``) again from its resident set now, where one is kept."""
    if _PEAK_KEPT:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")


def peak_bytes() -> int | None:
    """This process's peak resident set since it started or since ``reset_peak``; None where none is kept."""
    if not _PEAK_KEPT:
        return None
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def used_mb(counted_bytes: int) -> int:
    """Memory as Lambda's REPORT line states it: whole MB, rounded up."""
    return -(-counted_bytes // MB)


class Invocation(NamedTuple):
    """An invocation running in a warm process: what its process sends the host when it starts."""

    function: str
    pid: int
    started: float  # epoch seconds
    offset_bytes: int  # added to the process's resident set: what a container of its function holds beyond it
    memory_mb: int  # its function's memory (its process's AWS_LAMBDA_FUNCTION_MEMORY_SIZE)


class MemoryWatch:
    """The processes running an invocation, each read every ``POLL_S`` while it runs: one whose memory passes its
    function's is killed (SIGKILL; on Windows, terminated), as Lambda kills a container out of memory, and handed to
    ``on_kill``."""

    def __init__(self, on_kill: Callable[[str, Invocation], None]) -> None:
        self.on_kill = on_kill
        self._running: dict[str, tuple[Invocation, psutil.Process]] = {}  # request id → its invocation, its process
        self._lock = threading.Lock()

    def started(self, request_id: str, invocation: Invocation) -> None:
        with suppress(psutil.NoSuchProcess):  # one ended already is not watched
            process = psutil.Process(invocation.pid)  # kept: each read after is one call, and a kill checks its pid
            with self._lock:
                self._running[request_id] = (invocation, process)

    def ended(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)

    def check(self) -> None:
        """Read each running invocation's process once: kill those past their memory, forget those ended."""
        with self._lock:
            running = list(self._running.items())
        for request_id, (invocation, process) in running:
            resident = _resident(process)
            if resident is not None and resident + invocation.offset_bytes <= invocation.memory_mb * MB:
                continue
            with self._lock:
                if self._running.pop(request_id, None) is None:  # it ended meanwhile
                    continue
            if resident is not None:
                self.on_kill(request_id, invocation)  # first: its container may see it die at once
                with suppress(psutil.NoSuchProcess):  # it ended meanwhile
                    process.kill()

    def run(self, stop: threading.Event) -> None:
        """Check every ``POLL_S`` until ``stop`` is set."""
        while not stop.wait(POLL_S):
            self.check()
