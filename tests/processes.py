"""What is left of a command's processes once it has ended (Linux's /proc)."""

from __future__ import annotations

import time
from pathlib import Path


def running_in_group(group: int) -> list[str]:
    """The processes of a process group that have not exited, as ``pid command``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name: state, ppid, pgrp, …
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(f"{stat.parent.name} {command[:200]}")
    return found


def left_running(group: int, within_s: float = 10) -> list[str]:
    """The processes of ``group`` still running after up to ``within_s`` (none, as soon as there are none)."""
    deadline = time.monotonic() + within_s
    while (found := running_in_group(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found
