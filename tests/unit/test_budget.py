"""A run's dollar budget: a training option of every command, priced by the plan with the spend counting it adds,
counted in the run table, and shown against the spend."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from slsml.accounting import prices
from slsml.cli import display, display_runs, options
from slsml.cli.main import build_parser, main
from slsml.client import fit, runs
from slsml.cost.modelinfo import from_params
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.predict import predict
from slsml.cost.workload import run_workload
from slsml.pipeline import spend
from slsml.spec.config import DropInRequest, TrainingSpec
from slsml.state import records
from slsml.state.records import Counter, RunRecord, RunStatus
from slsml.state.runtable import RunTable


def _plan(spec: TrainingSpec) -> Plan:
    figures = from_params(1_000_000, Parameters(), compute_per_sample_s=0.002)
    return predict(run_workload(figures, spec), Parameters(), Quotas(), prices.PriceTable())


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "5"],
        ["demo"],
        [
            "plan",
            "--params",
            "1000",
            "--iterations",
            "5",
            "--workers",
            "2",
            "--reducers",
            "2",
            "--pipeline-stages",
            "1",
            "--stale-weights",
            "0",
        ],
    ],
)
def test_budget_usd_is_a_training_option_of_every_command_that_starts_or_plans_a_run(argv: list[str]) -> None:
    args = build_parser().parse_args([*argv, "--budget-usd", "2.5"])
    assert options.training_spec(args).budget_usd == 2.5
    assert options.training_spec(build_parser().parse_args(argv)).budget_usd is None  # no budget unless given
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--budget-usd", "lots"])


def test_the_sidecar_and_fit_take_a_budget_and_a_budget_is_above_zero() -> None:
    request = DropInRequest.model_validate_json('{"dataset": "d", "training": {"budget_usd": 0.75}}')
    assert TrainingSpec.model_validate(request.training).budget_usd == 0.75
    assert fit._spec(256, 32, 1, None, None, {"budget_usd": 0.75}).budget_usd == 0.75
    with pytest.raises(ValueError, match="greater than 0"):
        TrainingSpec(budget_usd=0)
    resume = build_parser().parse_args(["run", "resume", "r", "--budget-usd", "4"])
    assert resume.budget_usd == 4.0


def test_a_budget_adds_each_invocations_spend_count_and_the_launchs_read_to_the_plan() -> None:
    spec = TrainingSpec(workers=6, reducers=3, global_batch=192, iterations=40)
    plain, budgeted = _plan(spec), _plan(spec.model_copy(update={"budget_usd": 5.0}))
    invocations = sum(f.invocations for f in plain.functions)
    assert invocations == 1 + 2 * 6 + 2 * 3
    added = {
        op: budgeted.requests_per_iteration[op] - plain.requests_per_iteration.get(op, 0)
        for op in budgeted.requests_per_iteration
    }
    assert {op: n for op, n in added.items() if n} == {"dynamodb:UpdateItem": invocations, "dynamodb:GetItem": 1}
    assert budgeted.write_units == plain.write_units + invocations and budgeted.read_units == plain.read_units + 1
    calls = {(e.operation, e.count) for e in budgeted.extra_calls} - {(e.operation, e.count) for e in plain.extra_calls}
    assert calls == {("dynamodb:UpdateItem", invocations), ("dynamodb:GetItem", 1)}
    assert budgeted.run_dollars > plain.run_dollars
    assert budgeted.iteration_s > plain.iteration_s  # the launch reads the spend on the critical path


def test_the_plan_says_whether_the_run_fits_its_budget(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--params",
        "1000000",
        "--compute-per-sample",
        "0.002",
        "--iterations",
        "40",
        "--workers",
        "6",
        "--reducers",
        "3",
        "--batch",
        "192",
        "--json",
    ]
    assert main([*argv, "--budget-usd", "1000"]) == 0
    within = json.loads(capsys.readouterr().out)
    dollars = within["verdict"]["run_dollars"]
    assert dollars == pytest.approx(
        _plan(TrainingSpec(workers=6, reducers=3, global_batch=192, iterations=40, budget_usd=1000)).run_dollars
    )
    assert within["verdict"]["budget"] == f"{prices.usd(dollars)} for the run is within its budget of $1,000.00"
    below = dollars / 2
    assert main([*argv, "--budget-usd", str(below)]) == 0
    over = json.loads(capsys.readouterr().out)["verdict"]["budget"]
    assert over == (
        f"{prices.usd(dollars)} for the run is above its budget of {prices.usd(below)}: run start refuses it"
    )
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["budget"] is None


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("dynamodb").create_table(**records.create_table_arguments("runs"))
        yield RunTable(boto3.resource("dynamodb").Table("runs"))


def test_the_spend_is_an_atomic_counter_of_its_own_beside_the_run(table: RunTable) -> None:
    spec = TrainingSpec(workers=2, reducers=1, iterations=3, budget_usd=0.05)
    table.table.put_item(Item=records.run_item("r", "d", spec, 1.0))
    assert table.spent("r") == 0.0
    amounts = [0.000123 * (1 + i % 7) for i in range(60)]
    for dollars in amounts:  # an ADD each (atomic in DynamoDB, and in the embedded cloud, which serializes them)
        table.add_spend("r", dollars)
    assert table.spent("r") == pytest.approx(sum(amounts), rel=1e-12)
    assert [run.run_id for run in table.list_runs()] == ["r"] and table.list_iterations("r") == []
    run = table.get_run("r")
    assert spend.exhausted(run, spend.spent(SimpleNamespace(table=table), run)) is None  # $0.029 of $0.05
    table.add_spend("r", 0.025)
    reason = spend.exhausted(run, table.spent("r"))
    assert reason is not None and reason.startswith(f"{spend.BUDGET_REASON}: $0.05378 spent of the $0.05 budget")
    plain = run.model_copy(update={"training": spec.model_copy(update={"budget_usd": None})})
    assert spend.exhausted(plain, None) is None


def test_a_resume_takes_a_new_budget_and_keeps_the_rest_of_the_spec(table: RunTable) -> None:
    spec = TrainingSpec(workers=2, reducers=1, iterations=3, budget_usd=0.01, quorum=0.5)
    table.table.put_item(Item=records.run_item("r", "d", spec, 1.0))
    table.stop("r", "budget: spent")
    resumed = table.resume("r", 2, spec.model_copy(update={"budget_usd": 0.05}))
    assert resumed is not None and resumed.training == spec.model_copy(update={"budget_usd": 0.05})
    assert table.get_run("r").training.budget_usd == 0.05 and resumed.generation == 1


def test_the_summary_shows_the_spend_against_the_budget(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    spec = TrainingSpec(workers=2, reducers=1, iterations=6, budget_usd=0.004)
    run = RunRecord(
        run_id="b",
        status=RunStatus.STOPPED,
        training=spec,
        iteration=3,
        workers=2,
        dataset="d",
        created_at=0.0,
        updated_at=5.0,
        reason="budget: $0.0042 spent of the $0.004 budget",
    )
    summary = runs.summarize(run, [], 5.0, spent_usd=0.0042)
    display_runs.print_summary(summary, as_json=True)
    out, err = capsys.readouterr()
    assert {k: json.loads(out)[k] for k in ("budget_usd", "spent_usd")} == {"budget_usd": 0.004, "spent_usd": 0.0042}
    row = re.search(r"│ budget\s*│ (.*?)\s*│", err)
    assert row and row[1].startswith(display.spend(0.0042, 0.004)), err
    assert display.spend(0.0042, 0.004) == "$0.0042 spent of the $0.004 budget (105%)"
    assert (
        runs.summarize(
            run.model_copy(update={"training": TrainingSpec(workers=2, reducers=1, iterations=6)}), [], 5.0
        ).budget_usd
        is None
    )


def test_the_progress_line_shows_the_spend_against_the_budget() -> None:
    spec = TrainingSpec(workers=2, reducers=1, iterations=6, budget_usd=0.01)
    run = RunRecord(
        run_id="b",
        status=RunStatus.RUNNING,
        training=spec,
        iteration=2,
        workers=2,
        dataset="d",
        created_at=0.0,
        updated_at=5.0,
    )
    progress = display_runs.ProgressText(started=0.0, spent=lambda run: 0.0042)
    line = progress.update(run, Counter(iteration=1, train_loss=0.5, workers=2))
    assert line.endswith("  $0.0042 spent of the $0.01 budget (42%)"), line
    plain = run.model_copy(update={"training": spec.model_copy(update={"budget_usd": None})})
    assert (
        display_runs.ProgressText(started=0.0, spent=lambda run: 0.0042)
        .update(plain, Counter(iteration=1))
        .endswith(f"{display.dollars(0.0042)} so far")
    )
