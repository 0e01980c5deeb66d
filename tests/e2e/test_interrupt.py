"""A one-shot local command interrupted as a user interrupts it: Ctrl-C (SIGINT to its process group, as a
terminal sends it) at random moments of `slsml run start --local`, and SIGTERM twice. Each time it exits
within seconds, says what became of its run, and leaves no process; a run name already used is refused
and nothing of the earlier run is overwritten.

``SLSML_INTERRUPTS`` sets how many random moments are tried (default 3; the reliability docs' figure is
20)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from slsml.client import demo
from slsml.training import modelio
from tests.processes import left_running, running_in_group

SLSML = [sys.executable, "-m", "slsml.cli.main"]
MOMENTS = int(os.environ.get("SLSML_INTERRUPTS", "3"))
EXIT_WITHIN_S = 10


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("interrupt")
    x, y, x_test, y_test = demo.digits()
    np.savez(folder / "digits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    (folder / "cnn.keras").write_bytes(modelio.save_model(demo.digits_cnn(seed=1)))
    return folder


def _command(run_id: str, iterations: int = 60) -> list[str]:
    return [
        *SLSML,
        "run",
        "start",
        "--local",
        "--model",
        "cnn.keras",
        "--data",
        "digits.npz",
        "--iterations",
        str(iterations),
        "--eval-every",
        "0",
        "--workers",
        "2",
        "--pool",
        "2",
        "--run-id",
        run_id,
    ]


def _start(home: Path, run_id: str) -> subprocess.Popen:
    """`slsml run start --local` in a process group of its own, as a terminal starts a command."""
    return subprocess.Popen(
        _command(run_id), cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _ended(command: subprocess.Popen, signalled_at: float) -> tuple[float, str]:
    """Seconds from the signal to the command's exit, and what it wrote on stderr."""
    try:
        _, err = command.communicate(timeout=EXIT_WITHIN_S + 20)
    except subprocess.TimeoutExpired:
        os.killpg(command.pid, signal.SIGKILL)
        command.communicate()
        pytest.fail(f"the command had not ended {EXIT_WITHIN_S + 20} s after it was interrupted")
    return time.monotonic() - signalled_at, err


_MOMENTS_RNG = random.Random(31)


@pytest.mark.parametrize("moment", sorted(_MOMENTS_RNG.uniform(0.5, 25) for _ in range(MOMENTS)))
def test_ctrl_c_at_any_moment_ends_the_command_and_its_processes(home: Path, moment: float) -> None:
    run_id = f"interrupted-{moment * 1000:.0f}"
    command = _start(home, run_id)
    time.sleep(moment)
    os.killpg(command.pid, signal.SIGINT)  # the whole foreground group, as Ctrl-C in a terminal
    took, err = _ended(command, time.monotonic())
    assert took < EXIT_WITHIN_S, (took, err[-2000:])
    said = err.strip().splitlines()[-1]
    if command.returncode == -signal.SIGINT:  # still importing: Python's own Ctrl-C, before anything started
        assert said == "KeyboardInterrupt", err[-2000:]
    else:
        assert command.returncode == 130, err[-2000:]
        assert said == "interrupted" or said.startswith(f"interrupted: run {run_id} "), err[-2000:]
    assert left_running(command.pid) == []


def _await_workers(home: Path, run_id: str) -> None:
    deadline = time.monotonic() + 120
    while not (home / ".slsml" / "logs" / run_id / "worker.log").exists():  # its functions run
        assert time.monotonic() < deadline, "the run's workers never started"
        time.sleep(0.2)


def _output(pid: int) -> set[str]:
    """What a process's standard output and error are (e.g. ``pipe:[123]``); none once it has exited."""
    found = set()
    for fd in (1, 2):
        with contextlib.suppress(OSError):  # gone meanwhile
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def test_no_process_the_command_starts_holds_its_output(home: Path) -> None:
    """A reader of the command's output (a pipe, ``| tee``) sees it end when the command ends, not when the last
    of its processes has."""
    command = _start(home, "output")
    _await_workers(home, "output")
    own = _output(command.pid)
    others = [line for line in running_in_group(command.pid) if int(line.split()[0]) != command.pid]
    holding = [line for line in others if _output(int(line.split()[0])) & own]
    os.killpg(command.pid, signal.SIGINT)
    _ended(command, time.monotonic())
    assert others and len(own) == 2
    assert not holding, "\n".join(line[:120] for line in holding)


def test_sigterm_twice_ends_the_command_at_once(home: Path) -> None:
    command = _start(home, "terminated")
    _await_workers(home, "terminated")
    command.send_signal(signal.SIGTERM)
    command.send_signal(signal.SIGTERM)
    took, err = _ended(command, time.monotonic())
    assert took < EXIT_WITHIN_S, (took, err[-2000:])
    assert command.returncode == 130
    assert left_running(command.pid) == []


def test_a_run_name_already_used_is_refused_and_its_record_kept(home: Path) -> None:
    done = subprocess.run(_command("named", iterations=2), cwd=home, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = {path: path.read_bytes() for path in (home / "runs" / "named").iterdir()}
    assert {path.name for path in record} == {"final.keras", "summary.json"}
    again = subprocess.run(done.args, cwd=home, capture_output=True, text=True, timeout=600)
    assert again.returncode == 2
    assert "--run-id named: an earlier local run has this name (runs/named and .slsml/logs/named)" in again.stderr
    assert {path: path.read_bytes() for path in (home / "runs" / "named").iterdir()} == record
