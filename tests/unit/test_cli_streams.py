"""The slsml command in a pipe: each command's result on stdout (``--json``: one JSON line there), progress and
diagnostics on stderr, lines not cut at 80 columns; the exit codes; a command's own usage for an unknown flag;
``run list`` oldest first, the same runs whether or not the local service is up."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slsml.cli import display, targets
from slsml.cli.main import main
from slsml.client import runs
from slsml.spec.config import TrainingSpec
from slsml.state.records import Counter, RunRecord, RunStatus

Capture = pytest.CaptureFixture[str]
REASON = "the data has 3 classes but the model's last layer has 10 units: give it a model whose output fits the data"
READ_STATUS = "import json, sys; print(json.load(sys.stdin)[\"status\"])"
PLAN = ("plan", "--params", "100000", "--workers", "4", "--reducers", "2", "--iterations", "10")


def _record(run_id: str, created_at: float, status: RunStatus, reason: str | None = None) -> None:
    """A local run's record under runs/, as a followed run leaves it."""
    run = RunRecord(run_id=run_id, status=status, reason=reason, training=TrainingSpec(iterations=5), iteration=5,
                    workers=4, dataset="d", created_at=created_at, updated_at=created_at + 30)
    targets.record(None, runs.summarize(run, [], wall_s=30.0))


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two runs recorded under ./runs, the one whose name sorts first started last; no local service; stdout and
    stderr not a terminal and no COLUMNS: as in a pipe."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    _record("a-newer", time.time() - 60, RunStatus.FAILED, REASON)
    _record("b-older", time.time() - 3600, RunStatus.COMPLETED)
    return tmp_path


def _lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def test_run_list_goes_to_stdout_oldest_first_and_as_json(recorded: Path, capsys: Capture) -> None:
    assert main(["run", "list"]) == 0
    out, err = capsys.readouterr()
    assert "a-newer" not in err and "b-older" not in err
    rows = _lines_with(out, "-newer") + _lines_with(out, "-older")
    assert len(rows) == 2 and out.index("b-older") < out.index("a-newer")  # by start time, not by name
    assert REASON in rows[0]  # the row whole on one line: not cut at 80 columns
    assert main(["run", "list", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [summary["run_id"] for summary in json.loads(out)] == ["b-older", "a-newer"]
    assert "a-newer" in err  # the table a person reads, beside the JSON


def test_run_status_goes_to_stdout_and_its_json(recorded: Path, capsys: Capture) -> None:
    assert main(["run", "status", "a-newer"]) == 0
    out, err = capsys.readouterr()
    assert _lines_with(out, "status") and REASON in out and err == ""
    assert main(["run", "status", "a-newer", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "FAILED" and REASON in err
    assert main(["run", "status", "no-such-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no run named 'no-such-run'" in err


def test_plan_goes_to_stdout_and_its_json(recorded: Path, capsys: Capture) -> None:
    assert main(list(PLAN)) == 0
    out, err = capsys.readouterr()
    assert "time per iteration" in out and "time per iteration" not in err
    assert main([*PLAN, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["dollars"]["run"] > 0 and "time per iteration" in err


def test_local_status_and_env_say_no_service_on_stderr_with_exit_code_1_and_2(recorded: Path,
                                                                              capsys: Capture) -> None:
    assert main(["local", "status"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "no local service is up" in err
    assert main(["local", "status", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) is None
    assert main(["local", "env"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no local service is up" in err


def test_version_help_and_a_commands_own_usage(capsys: Capture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.split() == ["slsml", importlib.metadata.version("slsml")]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "exit codes: 0 done; 1 the run failed" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as done:
        main(["run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "3", "--batch-count",
              "32"])
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert err.startswith("usage: slsml run start ") and "slsml run start: error: unrecognized arguments:" in err
    with pytest.raises(SystemExit) as done:
        main(["run", "list", "--bogus"])
    assert done.value.code == 2 and capsys.readouterr().err.startswith("usage: slsml run list ")


def test_progress_into_a_pipe_is_whole_lines(monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    spec = TrainingSpec(workers=4, reducers=2, iterations=20)

    def run(iteration: int) -> RunRecord:
        return RunRecord(run_id="run-with-a-long-name-20261125-120000", status=RunStatus.RUNNING, training=spec,
                         iteration=iteration, workers=4, dataset="d", created_at=0.0, updated_at=0.0)

    def counter(iteration: int) -> Counter:
        return Counter(iteration=iteration, launched_at=100.0, reduce_fired_at=100.25, merged_at=100.75, arrived=4,
                       participant_count=4, reduce_fired_by=1, train_loss=0.5, train_accuracy=0.8, workers=4)

    with display.run_progress("run-with-a-long-name-20261125-120000", 20, time.time()) as show:
        for iteration in range(1, 4):
            show(run(iteration), counter(iteration - 1))
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[0].startswith("run-with-a-long-name-20261125-120000 1/20  loss 0.5000")
    assert lines[-1].startswith("run-with-a-long-name-20261125-120000 3/20  loss 0.5000")
    assert "workers 0.25 s reduce+merge 0.50 s" in lines[-1] and len(lines[-1]) > 80
    assert len(lines) == 2  # the first, then none within ProgressLines.EVERY_S, then the last


def test_in_a_shell_pipe(recorded: Path) -> None:
    """``slsml run list | grep NAME``, and ``slsml run status RUN --json`` read by a JSON tool (as ``| jq .status``)."""
    slsml = f"{sys.executable} -m slsml.cli.main"
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    found = subprocess.run(f"{slsml} run list | grep b-older", shell=True, capture_output=True, text=True,
                           cwd=recorded, env=environment, timeout=120)
    assert found.returncode == 0 and "COMPLETED" in found.stdout, found.stderr
    status = subprocess.run(f"{slsml} run status a-newer --json | {sys.executable} -c '{READ_STATUS}'", shell=True,
                            capture_output=True, text=True, cwd=recorded, env=environment, timeout=120)
    assert status.stdout == "FAILED\n", status.stderr
