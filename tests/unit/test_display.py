"""What the slsml command draws lives in slsml.display; cli.py parses and runs commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slsml import cli, display
from slsml.config import TrainingSpec
from slsml.records import Counter, RunRecord, RunStatus
from slsml.runs import RunSummary

SUMMARY = RunSummary(
    run_id="run-1", status=RunStatus.COMPLETED, reason=None, iterations=5, workers=4,
    training=TrainingSpec(workers=4, reducers=2, iterations=10, eval_every=3, deadline_floor=0.7),
    test_accuracy=0.91234, test_loss=0.3, final_train_loss=0.2, wall_s=12.5, median_iteration_s=2.0,
    median_worker_compute_s=0.5, overhead_share=0.75, late_workers=0, cost_usd=0.0123, cost_per_iteration_usd=0.001,
    cost_by_service_usd={"lambda": 0.01, "s3": 0.0023}, gb_seconds=42.0,
    requests_per_iteration={"s3:GetObject": 18, "s3:PutObject": 8, "sns:PublishBatch": 8},
)


def test_cli_draws_nothing_itself() -> None:
    source = Path(cli.__file__).read_text()
    assert not re.search(r"\brich\b|Table\(|Progress\(", source)


def test_the_summary_table_and_its_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    display.print_summary(SUMMARY, as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(SUMMARY.model_dump_json())
    assert "0.9123" in err and "s3: GetObject 18, PutObject 8" in err
    assert re.search(r"options\s*│ eval_every 3, deadline_floor 0.7\s*│", err), err  # the spec's, not at default
    assert f"{display.dollars(0.0123)} in all, {display.dollars(0.001)} per iteration" in err
    assert display.dollars(1234.5) == "$1,234.50" and display.dollars(0.0123) == "$0.0123"


def test_the_run_list(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    failed = SUMMARY.model_copy(update={"run_id": "run-2", "status": RunStatus.FAILED, "reason": "no data",
                                        "test_accuracy": None})
    display.print_runs([SUMMARY, failed])
    rows = [line for line in capsys.readouterr().err.splitlines() if "run-" in line]
    assert [re.split(r"\s*│\s*", row.strip("│ "))[:4] for row in rows] == [
        ["run-1", "COMPLETED", "5", "0.9123"], ["run-2", "FAILED", "5", "–"]]


def test_the_progress_line_says_loss_accuracy_and_time_per_iteration() -> None:
    text = display.ProgressText(started=0.0)
    run = RunRecord(run_id="r", status=RunStatus.RUNNING, training=TrainingSpec(workers=4, reducers=2, iterations=10),
                    iteration=4, workers=4, dataset="d", created_at=0.0, updated_at=0.0)
    assert text.update(run, None) == ""
    line = text.update(run, Counter(iteration=3, train_loss=0.5, train_accuracy=0.75, test_accuracy=0.6))
    assert line.startswith("loss 0.5000  acc 0.750  test acc 0.600  ") and "s/iter" in line
    later = text.update(run, Counter(iteration=4, train_loss=0.25))
    assert "test acc 0.600" in later  # the last one seen
    with display.run_progress("run-1", 10, started=0.0) as show:
        show(run, Counter(iteration=4, train_loss=0.5))
