"""The local host's memory watch: a process running an invocation whose resident set passes its function's memory
is killed (SIGKILL), as Lambda kills a container out of memory; one within its memory runs on."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from slsml.local import memory
from slsml.local.memory import Invocation, MemoryWatch

# allocates 8 MB every 10 ms (written, so resident), up to 2 GB, then waits
GROWING = (
    "import time\nheld = []\nfor _ in range(256):\n    held.append(b'\\x01' * 2**23)\n    time.sleep(0.01)\n"
    "time.sleep(60)"
)
STILL = "import time\ntime.sleep(60)"


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_process_past_its_memory_is_killed_and_one_within_it_runs_on() -> None:
    growing, still = _python(GROWING), _python(STILL)
    killed: list[tuple[str, Invocation]] = []
    watch = MemoryWatch(lambda request_id, invocation: killed.append((request_id, invocation)))
    stop = threading.Event()
    try:
        grows = Invocation("worker", growing.pid, time.time(), 0, 256)
        watch.started("grows", grows)
        watch.started("stays", Invocation("worker", still.pid, time.time(), 0, 128))
        threading.Thread(target=watch.run, args=(stop,), daemon=True).start()
        assert growing.wait(timeout=60) == -signal.SIGKILL
        stop.wait(10 * memory.POLL_S)  # the watch goes on reading the other one
        assert still.poll() is None
        assert killed == [("grows", grows)]
        resident = memory.resident_bytes(still.pid)
        assert resident is not None and 0 < resident < 128 * memory.MB
    finally:
        stop.set()
        still.kill()
        growing.kill()
        still.wait()
        growing.wait()
    assert memory.resident_bytes(growing.pid) is None  # ended: the watch would forget it


def test_a_process_counts_what_its_container_would_hold_beyond_it_and_only_while_it_runs_an_invocation() -> None:
    """An invocation's offset (the libraries a container imported, less what the process held when forked) counts
    with its process's resident set; a process whose invocation ended is not read."""
    idle, other = _python(STILL), _python(STILL)
    killed: list[str] = []
    watch = MemoryWatch(lambda request_id, invocation: killed.append(request_id))
    try:
        watch.started("ended", Invocation("merger", other.pid, time.time(), 512 * memory.MB, 128))
        watch.ended("ended")
        watch.started("runs", Invocation("merger", idle.pid, time.time(), 512 * memory.MB, 128))
        watch.check()
        assert killed == ["runs"]
        assert idle.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        watch.check()  # nothing left to read
        assert killed == ["runs"]
    finally:
        idle.kill()
        other.kill()
        idle.wait()
        other.wait()


def test_an_invocation_whose_process_ended_before_it_was_watched_is_not_read_and_kills_nothing() -> None:
    ended = _python("pass")
    ended.wait()
    killed: list[str] = []
    watch = MemoryWatch(lambda request_id, invocation: killed.append(request_id))
    watch.started("gone", Invocation("merger", ended.pid, time.time(), 512 * memory.MB, 128))  # past its memory
    watch.check()
    assert killed == []
