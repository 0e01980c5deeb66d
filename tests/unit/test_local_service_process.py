"""How ``slsml local down`` tells that the service's process ended: as soon as it exits, not once its parent (the
``local up`` that started it, or the init process that adopted it) has reaped it."""

from __future__ import annotations

import subprocess
import sys
import time

from slsml.local import service


def test_a_process_that_exited_is_not_alive_though_its_parent_has_not_reaped_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert service._alive(child.pid)  # running: reading its input
        assert child.stdin is not None
        child.stdin.close()  # it exits now, and stays a zombie until ``wait`` below reaps it
        deadline = time.monotonic() + 30
        while service._alive(child.pid):
            assert time.monotonic() < deadline, f"process {child.pid} exited, yet it is still taken for alive"
            time.sleep(0.05)
    finally:
        child.wait()
    assert not service._alive(child.pid)
