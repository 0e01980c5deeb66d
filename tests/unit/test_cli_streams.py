"""The slsml command in a pipe: each command's result on stdout (``--json``: one JSON line there), progress and
diagnostics on stderr, lines not cut at 80 columns; a command that acts says what it did on stderr (``--json``: also
as one JSON line on stdout); every command that shows a result takes ``--json``; the exit codes; a command's own usage
for an unknown flag; ``run list`` oldest first, the same runs whether or not the local service is up."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest

from slsml.aws import clients
from slsml.cli import display_runs, targets
from slsml.cli.main import build_parser, main
from slsml.client import runs
from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.spec.config import TrainingSpec
from slsml.state.orchestration import Orchestrator
from slsml.state.records import Counter, RunRecord, RunStatus

from . import cloud

Capture = pytest.CaptureFixture[str]
REASON = "the data has 3 classes but the model's last layer has 10 units: give it a model whose output fits the data"
READ_STATUS = 'import json, sys; print(json.load(sys.stdin)["status"])'
PLAN = ("plan", "--params", "100000", "--workers", "4", "--reducers", "2", "--iterations", "10")


def _record(run_id: str, created_at: float, status: RunStatus, reason: str | None = None) -> None:
    """A local run's record under runs/, as a followed run leaves it."""
    run = RunRecord(
        run_id=run_id,
        status=status,
        reason=reason,
        training=TrainingSpec(iterations=5),
        iteration=5,
        workers=4,
        dataset="d",
        created_at=created_at,
        updated_at=created_at + 30,
    )
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


def test_local_status_and_env_say_no_service_on_stderr_with_exit_code_1_and_2(recorded: Path, capsys: Capture) -> None:
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
        main(
            [
                "run",
                "start",
                "--local",
                "--model",
                "m.keras",
                "--data",
                "d.npz",
                "--iterations",
                "3",
                "--batch-count",
                "32",
            ]
        )
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert err == (
        "slsml run start: error: unknown option --batch-count (did you mean --batch?); `slsml run start --help`"
        " lists its options\n"
    )
    with pytest.raises(SystemExit) as done:
        main(["run", "list", "--bogus"])
    assert done.value.code == 2 and capsys.readouterr().err.startswith("slsml run list: error: unknown option --bogus")


def test_progress_into_a_pipe_is_whole_lines(monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    spec = TrainingSpec(workers=4, reducers=2, iterations=20)

    def run(iteration: int) -> RunRecord:
        return RunRecord(
            run_id="run-with-a-long-name-20261125-120000",
            status=RunStatus.RUNNING,
            training=spec,
            iteration=iteration,
            workers=4,
            dataset="d",
            created_at=0.0,
            updated_at=0.0,
        )

    def counter(iteration: int) -> Counter:
        return Counter(
            iteration=iteration,
            launched_at=100.0,
            reduce_fired_at=100.25,
            merged_at=100.75,
            arrived=4,
            participant_count=4,
            reduce_fired_by=1,
            train_loss=0.5,
            train={"loss": 0.5, "accuracy": 0.8},
            workers=4,
        )

    with display_runs.run_progress("run-with-a-long-name-20261125-120000", 20, time.time()) as show:
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
    found = subprocess.run(
        f"{slsml} run list | grep b-older",
        shell=True,
        capture_output=True,
        text=True,
        cwd=recorded,
        env=environment,
        timeout=120,
    )
    assert found.returncode == 0 and "COMPLETED" in found.stdout, found.stderr
    status = subprocess.run(
        f"{slsml} run status a-newer --json | {sys.executable} -c '{READ_STATUS}'",
        shell=True,
        capture_output=True,
        text=True,
        cwd=recorded,
        env=environment,
        timeout=120,
    )
    assert status.stdout == "FAILED\n", status.stderr


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("slsml",)
) -> dict[str, argparse.ArgumentParser]:
    """Every command of ``parser`` (those without subcommands), by its words."""
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups:
        return {" ".join(path): parser}
    return {
        name: command
        for group in groups
        for word, sub in group.choices.items()
        for name, command in _commands(sub, (*path, word)).items()
    }


def test_every_command_takes_json() -> None:
    commands = _commands(build_parser())
    assert len(commands) > 20 and {"slsml run stop", "slsml run fetch", "slsml local down"} <= commands.keys()
    assert [name for name, command in commands.items() if "--json" not in command._option_string_actions] == []


def _json(capsys: Capture, *args: str) -> tuple[dict, str]:
    """``slsml ARGS --json``, which must succeed: the JSON line it printed on stdout, and its stderr."""
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1, out
    return json.loads(out), err


@pytest.fixture
def acting(services: Services, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Services:
    """The run commands' target: the moto cloud of ``services`` with a run state machine, holding run ``r`` (2
    workers, 5 iterations) on dataset ``d`` at iteration 0, launched, and a dataset ``e`` no run uses."""
    import keras

    from slsml.training import modelio

    monkeypatch.chdir(tmp_path)
    arn = boto3.client("stepfunctions").create_state_machine(
        name="runs",
        roleArn="arn:aws:iam::123456789012:role/runs",
        definition=json.dumps({"StartAt": "wait", "States": {"wait": {"Type": "Pass", "End": True}}}),
    )["stateMachineArn"]
    acting = dataclasses.replace(services, orchestrator=Orchestrator(clients.client("stepfunctions"), arn))
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    cloud.register_run(acting, modelio.save_model(model), "r")
    assert acting.table.claim_launch("r", 0, "launch-0", 0, 2) is not None
    x = np.zeros((20, 6), dtype=np.float32)
    data.put_dataset(acting.store, "e", x, np.zeros(20, dtype=np.int64), x[:4], np.zeros(4, dtype=np.int64))
    monkeypatch.setattr(targets, "target", lambda args: (acting, lambda run: []))
    return acting


def test_commands_that_act_say_so_on_stderr_and_as_json_on_stdout(acting: Services, capsys: Capture) -> None:
    result, err = _json(capsys, "run", "scale", "r", "--workers", "3")
    assert result == {"run_id": "r", "workers": 3, "was": 2, "applies": "from iteration 1 on"}
    assert "run r: 3 workers from iteration 1 on (was 2)" in err
    result, err = _json(capsys, "run", "stop", "r")
    assert result == {"run_id": "r", "status": "STOPPED"} and "run r stopped: no new iteration starts" in err
    assert acting.table.get_run("r").status == RunStatus.STOPPED
    result, err = _json(capsys, "run", "resume", "r")
    assert result == {"run_id": "r", "status": "RUNNING", "iteration": 0, "iterations": 5, "generation": 1}
    assert "run r resumed from its model entering iteration 0 (5 iterations to go)" in err
    objects = len(acting.store.list_keys("datasets/e/"))
    result, err = _json(capsys, "data", "rm", "e")
    assert result == {"dataset": "e", "objects": objects} and objects > 2 and f"({objects} objects)" in err
    assert acting.store.list_keys("datasets/e/") == []
    assert main(["run", "stop", "r"]) == 0  # without --json: the line alone, on stderr
    out, err = capsys.readouterr()
    assert out == "" and "run r stopped" in err


def test_run_fetch_and_local_down_as_json(recorded: Path, capsys: Capture) -> None:
    model = recorded / "final.keras"
    model.write_bytes(b"a model's bytes")
    summary = targets.recorded("b-older")[0].model_copy(update={"final_model": str(model)})
    (targets.RUNS_DIR / "b-older" / "summary.json").write_text(summary.model_dump_json())
    result, err = _json(capsys, "run", "fetch", "b-older", "--out", "fetched.keras")
    assert result == {"run_id": "b-older", "model": "fetched.keras", "bytes": len(b"a model's bytes")}
    assert (recorded / "fetched.keras").read_bytes() == b"a model's bytes" and "final model of b-older" in err
    result, err = _json(capsys, "local", "down")
    assert result == {"stopped": False, "recorded": 0} and "no local service was up" in err


def test_a_piped_plan_draws_its_rule_at_richs_width_and_its_tables_uncut(tmp_path: Path) -> None:
    """``slsml plan | less``: the ``detail`` rule as wide as rich draws into a pipe (80 columns), not across the
    width at which the tables are drawn whole."""
    planned = subprocess.run(
        [
            sys.executable,
            "-m",
            "slsml.cli.main",
            "plan",
            "--params",
            "10000",
            "--samples",
            "1000",
            "--sample-bytes",
            "100",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
        timeout=120,
    )
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    (rule,) = [line for line in lines if line.startswith("─") and " detail " in line]
    assert len(rule) == 80
    assert max(len(line) for line in lines) > 80  # a table wider than the rule: drawn whole, not cut
