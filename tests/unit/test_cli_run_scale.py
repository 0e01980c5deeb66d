"""`slsml run scale` on a run table in moto: the line it prints says from which iteration the new workers train
(the one the run is at if its launch comes after the scale, else the next; a stopped or failed run's first once
resumed); bad counts and a completed run fail on one line and change nothing.
(tests/e2e/test_local_service.py scales a run on the local service.)"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from slsml.cli import main as cli
from slsml.cli import runs as cli_runs
from slsml.cli import targets
from slsml.spec.config import TrainingSpec
from slsml.spec.limits import RunLimits
from slsml.state import records
from slsml.state.runtable import RunTable

ITERATIONS = 6
Capture = pytest.CaptureFixture[str]


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunTable]:
    """A run ``r`` of 4 workers (at most 8) at iteration 3, which ``slsml run scale`` reaches."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("COLUMNS", "200")
    with mock_aws():
        boto3.client("dynamodb").create_table(**records.create_table_arguments("runs"))
        runs = RunTable(boto3.resource("dynamodb").Table("runs"))
        spec = TrainingSpec(workers=4, max_workers=8, iterations=ITERATIONS)
        runs.table.put_item(Item=records.run_item("r", "d", spec, 1.0))
        runs.advance("r", 3, 0)
        services = types.SimpleNamespace(table=runs, limits=RunLimits())
        monkeypatch.setattr(targets, "required_target", lambda args: (services, None))
        yield runs


def _scale(workers: int, capsys: Capture) -> tuple[int, str]:
    code = cli.main(["run", "scale", "r", "--workers", str(workers)])
    return code, capsys.readouterr().err.strip()


def test_an_iteration_launched_before_the_scale_keeps_its_workers(table: RunTable, capsys: Capture) -> None:
    table.claim_launch("r", 3, "models/3", workers=4)
    assert _scale(8, capsys) == (0, "run r: 8 workers from iteration 4 on (was 4)")
    assert table.get_run("r").workers == 8


def test_an_iteration_launched_after_the_scale_takes_them(table: RunTable, capsys: Capture) -> None:
    table.claim_launch("r", 3, "models/3", workers=2, reason="run scale")  # as the WorkLauncher would, given 2
    assert _scale(2, capsys) == (0, "run r: 2 workers from iteration 3 on (was 4)")


def test_an_iteration_not_launched_yet_is_the_earliest(
    table: RunTable, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_runs, "LAUNCH_WAIT_S", 0.2)
    assert _scale(6, capsys) == (0, "run r: 6 workers from the next iteration launched on (3 at the earliest) (was 4)")


def test_a_run_at_the_end_of_its_budget_launches_no_iteration(table: RunTable, capsys: Capture) -> None:
    table.advance("r", ITERATIONS, 0)
    assert _scale(8, capsys) == (0, f"run r: 8 workers for no iteration: its budget of {ITERATIONS} is spent (was 4)")


@pytest.mark.parametrize("end", ["stop", "fail"])
def test_a_stopped_or_failed_run_takes_the_workers_once_resumed(table: RunTable, capsys: Capture, end: str) -> None:
    table.claim_launch("r", 3, "models/3", workers=4)
    getattr(table, end)("r", "ended for the test")
    status = table.get_run("r").status
    assert _scale(6, capsys) == (
        0,
        f"run r: 6 workers from the first iteration it runs once resumed (it is {status}) (was 4)",
    )
    assert table.resume("r", 3) is not None
    table.forget_iterations("r", 3)  # as `run resume` does
    run = table.get_run("r")
    assert table.claim_launch("r", 3, "resume-1", run.generation, run.workers, run.workers_reason).workers == 6


def test_bad_counts_fail_on_one_line_and_change_nothing(table: RunTable, capsys: Capture) -> None:
    code, said = _scale(9, capsys)
    assert code == 2 and re.fullmatch(r"error: 9 workers lie outside run 'r''s bounds of 1 to 8 .*", said), said
    # COMPLETED is written by the run's execution (the state machine), not by the run table: as it writes it
    table.table.update_item(
        Key={"pk": "RUN#r", "sk": records.META},
        UpdateExpression="SET #s = :done",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":done": "COMPLETED"},
    )
    code, said = _scale(5, capsys)
    assert code == 2 and said == "error: run 'r' is COMPLETED: only a RUNNING, STOPPED or FAILED run can be scaled"
    for text in ("0", "two"):
        with pytest.raises(SystemExit, match="2"):
            cli.main(["run", "scale", "r", "--workers", text])
        assert "argument --workers:" in capsys.readouterr().err
    assert table.get_run("r").workers == 4
