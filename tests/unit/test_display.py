"""What the slsml command draws lives in slsml.cli.display, its display_* modules and the report_* modules; the other
modules of slsml.cli parse and run commands."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from slsml.cli import display, display_runs
from slsml.cli import main as cli
from slsml.client import runs
from slsml.client.runs import RunSummary
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.state.records import Counter, IterationRecord, RunRecord, RunStatus

SUMMARY = RunSummary(
    run_id="run-1",
    status=RunStatus.COMPLETED,
    reason=None,
    iterations=5,
    workers=4,
    training=TrainingSpec(workers=4, reducers=2, iterations=10, eval_every=3, deadline_floor=0.7),
    test_accuracy=0.91234,
    test_loss=0.3,
    final_train_loss=0.2,
    wall_s=12.5,
    median_iteration_s=2.0,
    median_worker_compute_s=0.5,
    overhead_share=0.75,
    late_workers=0,
    cost_usd=0.0123,
    cost_per_iteration_usd=0.001,
    cost_by_service_usd={"lambda": 0.01, "s3": 0.0023},
    gb_seconds=42.0,
    requests_per_iteration={"s3:GetObject": 18, "s3:PutObject": 8, "sns:PublishBatch": 8},
)


def test_cli_draws_nothing_itself() -> None:
    commands = [
        path for path in Path(cli.__file__).parent.glob("*.py") if not path.stem.startswith(("display", "report"))
    ]
    assert len(commands) > 5
    for path in commands:
        assert not re.search(r"\brich\b|Table\(|Progress\(", path.read_text()), path.name


def test_the_summary_table_and_its_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    display_runs.print_summary(SUMMARY, as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(SUMMARY.model_dump_json())
    assert "0.9123" in err and "s3: GetObject 18, PutObject 8" in err
    assert re.search(r"test_loss\s*│ 0.3000\s*│", err) and re.search(r"test_accuracy\s*│ 0.9123\s*│", err), err
    validated = SUMMARY.model_copy(update={"test_loss": None, "val_loss": 0.25, "val_auc": 0.875})
    assert _row("test_loss", validated, capsys) == "–"  # always shown
    assert _row("val_auc", validated, capsys) == "0.8750" and _row("val_loss", validated, capsys) == "0.2500"
    assert re.search(r"options\s*│ eval_every 3, deadline_floor 0.7\s*│", err), err  # the spec's, not at default
    assert f"{display.dollars(0.0123)} in all, {display.dollars(0.001)} per iteration" in err
    assert display.dollars(1234.5) == "$1,234.50" and display.dollars(0.0123) == "$0.0123"
    assert re.search(r"workers\s*│ 4\s*│", err) and re.search(r"reducers \(quorum\)\s*│ 2 \(1\.0\)\s*│", err), err


def _scaled(
    workers: list[int], reasons: dict[int, str], status: RunStatus = RunStatus.COMPLETED, now: int | None = None
) -> RunSummary:
    """The summary of a run whose iterations were launched with ``workers``, the fleet changed at the iterations
    of ``reasons`` for those reasons (a counter keeps the run's reason of its launch, as the WorkLauncher writes
    it); ``now``: the run's workers (default the last iteration's)."""
    spec = TrainingSpec(workers=workers[0], reducers=2, iterations=len(workers) + 2, max_workers=8)
    reason = None
    iterations = []
    for i, w in enumerate(workers):
        reason = reasons.get(i, reason)
        iterations.append(IterationRecord(iteration=i, workers=w, workers_reason=reason, launched_at=float(i)))
    run = RunRecord(
        run_id="scaled",
        status=status,
        training=spec,
        iteration=len(workers),
        workers=now or workers[-1],
        dataset="d",
        created_at=0.0,
        updated_at=10.0,
    )
    return runs.summarize(run, iterations, wall_s=10.0)


def _row(name: str, summary: RunSummary, capsys: pytest.CaptureFixture[str]) -> str:
    display_runs.print_summary(summary, as_json=False)
    row = re.search(rf"│ {re.escape(name)}\s*│ (.*?)\s*│", capsys.readouterr().out)
    assert row, f"no {name} row"
    return row[1]


def test_the_summary_shows_how_the_workers_changed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    scaled = _scaled([4, 4, 8, 8, 8, 2, 2], {2: "run scale", 5: "run scale"})
    assert _row("workers", scaled, capsys) == "4 → 8 at iteration 2 (run scale) → 2 at iteration 5 (run scale)"
    assert _row("workers", _scaled([4, 4, 4], {}), capsys) == "4"
    tuned = _scaled([2, 2, 3, 3, 3], {2: "tuner (time): 1.2 s per round at 2 workers (measured), 0.9 s at 3"})
    assert _row("workers", tuned, capsys) == "2 → 3 at iteration 2 (tuner, time)"
    pending = _scaled([4, 4], {}, status=RunStatus.RUNNING, now=8)  # scaled, no iteration launched with 8 yet
    assert _row("workers", pending, capsys) == "4 → 8 next"
    many = _scaled([1, 2, 3, 4, 5, 6, 7, 8], {i: "run scale" for i in range(1, 8)})
    assert _row("workers", many, capsys) == (
        "1 → 2 at iteration 1 (run scale) → 3 at iteration 2 (run scale) → … 2"
        " more → 6 at iteration 5 (run scale) → 7 at iteration 6 (run scale) → 8"
        " at iteration 7 (run scale)"
    )


def test_the_run_list(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    failed = SUMMARY.model_copy(
        update={
            "run_id": "run-2",
            "status": RunStatus.FAILED,
            "reason": "no data",
            "test_accuracy": None,
            "started_at": 1.8e9,
        }
    )
    display_runs.print_runs([SUMMARY, failed])
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if "run-" in line]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1.8e9))
    assert [re.split(r"\s*│\s*", row.strip("│ "))[:6] for row in rows] == [
        ["run-1", "–", "COMPLETED", "5", "0.3000", "test_accuracy 0.9123"],
        ["run-2", started, "FAILED", "5", "0.3000", "–"],
    ]
    assert re.search(r"┃ test_loss\s*┃ first test metric\s*┃", out), out
    assert err == ""
    display_runs.print_runs([SUMMARY, failed], as_json=True)
    out, err = capsys.readouterr()
    assert [RunSummary.model_validate(s) for s in json.loads(out)] == [SUMMARY, failed] and "run-2" in err


def test_the_progress_line_says_loss_accuracy_and_time_per_iteration() -> None:
    text = display_runs.ProgressText(started=0.0)
    run = RunRecord(
        run_id="r",
        status=RunStatus.RUNNING,
        training=TrainingSpec(workers=4, reducers=2, iterations=10),
        iteration=4,
        workers=4,
        dataset="d",
        created_at=0.0,
        updated_at=0.0,
    )
    assert text.update(run, None) == ""
    line = text.update(
        run,
        Counter(
            iteration=3,
            train_loss=0.5,
            train={"loss": 0.5, "accuracy": 0.75},
            test={"loss": 0.7, "auc": 0.6, "accuracy": 0.5},
        ),
    )
    assert line.startswith("loss 0.5000  accuracy 0.750  test_auc 0.600  ") and "s/iter" in line  # the first metric
    later = text.update(run, Counter(iteration=4, train_loss=0.25, val={"loss": 0.8, "auc": 0.55}))
    assert later.startswith("loss 0.2500  test_auc 0.600  val_auc 0.550  ")  # the last ones seen
    assert "test_loss 0.900" in text.update(run, Counter(iteration=5, test={"loss": 0.9}))  # no metric: the loss
    several = {"loss": 0.9, "digit_loss": 0.7, "size_loss": 0.4, "digit_accuracy": 0.8}  # a model of two outputs
    assert "test_digit_accuracy 0.800" in text.update(run, Counter(iteration=6, test=several))  # past the losses
    with display_runs.run_progress("run-1", 10, started=0.0) as show:
        show(run, Counter(iteration=4, train_loss=0.5))


def test_the_line_before_a_run_says_what_model_averaging_applies() -> None:
    plan = ShardPlan.build([VariableSpec(name="kernel", shape=(2,), trainable=True)], 1)

    def line(**training: object) -> str:
        spec = TrainingSpec(reducers=1, **training)
        config = RunConfig(
            run_id="r",
            dataset="d",
            training=spec,
            optimizer=OptimizerConfig(name="adam"),
            loss="mse",
            classification=True,
            plan=plan,
        )
        return display_runs.describe_update(config)

    assert line() == "optimizer: Adam, learning rate 0.001, no weight decay, no clipping"
    assert line(algorithm="average", local_steps=16, local_momentum=0.9) == (
        "model averaging: 16 local steps a round of SGD, learning rate 0.1, momentum 0.9 (state fresh every"
        " round); the reducers apply the average weight change (FedAvg)"
    )
    fedopt = line(algorithm="average", local_steps=4, local_state="keep", server="optimizer")
    assert fedopt.endswith(
        "(state kept per worker slot); the reducers step Adam, learning rate 0.001, no weight"
        " decay, no clipping with the average weight change (FedOpt)"
    ), fedopt
