"""The function host's warm processes start from libraries imported once, in a fork server, run with the
host's environment as it is when they start, not the fork server's, and end with the host; leaving a runtime ends
every thread its host started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from slsml.local.runtime import LocalRuntime
from tests.processes import left_running

PROBE = textwrap.dedent(
    """
    import os, sys

    def probe():
        return os.environ.get("SLSML_PROBE"), os.environ.get("SLSML_GONE"), "tensorflow" in sys.modules
    """
)
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from slsml.local.host import start_preloading
    from slsml.local.runtime import LocalRuntime

    from probe_module import probe  # a module of its own: warm processes do not run a script's top level again

    if __name__ == "__main__":
        os.environ.update(SLSML_PROBE="as the fork server started", SLSML_GONE="yes")
        start_preloading()
        os.environ["SLSML_PROBE"] = "as the host started its processes"
        del os.environ["SLSML_GONE"]
        with LocalRuntime(workers=1, reducers=1, pool=1, log_dir=Path(sys.argv[1])) as local:
            containers = local.host._containers
            print(json.dumps({name: each.submit(probe).result() for name, each in containers.items()}), flush=True)
            time.sleep(300)  # until killed
    """
)


def test_warm_processes_start_preloaded_with_the_hosts_environment_and_end_with_the_host(tmp_path: Path) -> None:
    """The host is killed outright (SIGKILL: it shuts nothing down): its cloud, fork server and warm
    processes end anyway."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "probe_module.py").write_text(PROBE)
    with open(tmp_path / "stderr.txt", "w") as stderr:
        host = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "logs")],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )  # its own process group
    try:
        line = host.stdout.readline()
    finally:
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
    assert line, (tmp_path / "stderr.txt").read_text()
    assert left_running(host.pid) == []
    seen = json.loads(line)
    assert set(seen) >= {"worker", "reducer", "merger", "reduce_launcher", "work_launcher"}
    for function, (probe, gone, tensorflow) in seen.items():
        assert probe == "as the host started its processes", function
        assert gone is None, function
        assert tensorflow, function  # the Worker's and Merger's library, imported before any handler


def test_leaving_a_runtime_ends_every_thread_of_its_host(tmp_path: Path) -> None:
    """``slsml.fit`` returns as its runtime is left: a thread of it still running (a poller whose client retries,
    drawing its jitter from Python's generator) would share the caller's process, and a seed the caller sets next."""
    before = set(threading.enumerate())

    def started() -> list[str]:  # the host's threads (another runtime of this process started its own before)
        names = ("poll-", "dead-letters-", "acknowledge", "invocations", "memory")
        return sorted(t.name for t in set(threading.enumerate()) - before if t.name.startswith(names))

    with LocalRuntime(workers=1, reducers=1, pool=1, log_dir=tmp_path):
        running = started()
    assert "invocations" in running and "poll-worker" in running, running
    assert started() == []
