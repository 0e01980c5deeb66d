"""A run's usage records → requests per iteration, GB-seconds and cost, with a price table of round numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slsml.accounting import prices, usage
from slsml.accounting.prices import PriceTable
from slsml.client import runs
from slsml.spec.config import TrainingSpec
from slsml.state.records import RunRecord, RunStatus

PRICES = PriceTable(
    lambda_gb_second=1.0,
    lambda_request=0.5,
    s3_put=0.01,
    s3_get=0.001,
    sns_publish=0.1,
    sqs_request=0.0,
    dynamodb_write_unit=2.0,
    dynamodb_read_unit=1.0,
)


def record(
    iteration: int | None,
    requests: dict[str, int],
    invocation: str,
    duration_s: float = 1.0,
    memory_mb: int = 1024,
    **counts: float,
) -> usage.UsageRecord:
    return usage.UsageRecord(
        run_id="r",
        iteration=iteration,
        function="worker",
        start=0.0,
        end=duration_s,
        duration_s=duration_s,
        memory_mb=memory_mb,
        requests=requests,
        invocation=invocation,
        **counts,
    )


RECORDS = [
    record(None, {"dynamodb:UpdateItem": 1}, "started", write_units=1),  # the run starting: totals only
    record(0, {"s3:GetObject": 5, "s3:PutObject": 1}, "a"),  # iteration 0 is cold: more reads
    record(0, {"sns:PublishBatch": 1}, "b", sns_billed=3),
    record(1, {"s3:GetObject": 1, "s3:PutObject": 1}, "c", duration_s=0.25),
    record(1, {"sns:PublishBatch": 1}, "c", duration_s=0.25, sns_billed=2),  # the same invocation: 0.5 s
    record(2, {"s3:GetObject": 1, "s3:PutObject": 1, "dynamodb:GetItem": 1}, "d", read_units=1),
    record(3, {"dynamodb:UpdateItem": 1}, "completed", write_units=1),  # completion, after the last iteration
]


def test_medians_over_the_iterations_and_totals_over_the_run() -> None:
    figures = usage.figures(RECORDS, 3, PRICES)
    assert figures["requests_per_iteration"] == {
        "s3:GetObject": 1,
        "s3:PutObject": 1,
        "sns:PublishBatch": 1,  # GetItem: in one of three: left out
    }
    assert figures["gb_seconds"] == 1 + 1 + 0.5 + 1 + 1 + 1  # six invocations of 1 GB
    by_service = figures["cost_by_service_usd"]
    assert by_service["lambda"] == pytest.approx(5.5 + 6 * 0.5)
    assert by_service["s3"] == pytest.approx(7 * 0.001 + 3 * 0.01)
    assert by_service["sns"] == pytest.approx(5 * 0.1)  # billed publishes, not PublishBatch requests
    assert by_service["dynamodb"] == pytest.approx(2 * 2.0 + 1 * 1.0)
    assert figures["cost_usd"] == pytest.approx(sum(by_service.values()))
    iteration_costs = [2 * 1.5 + 0.005 + 0.01 + 0.3, 0.5 + 0.5 + 0.011 + 0.2, 1.5 + 0.011 + 1.0]
    assert figures["cost_per_iteration_usd"] == pytest.approx(sorted(iteration_costs)[1])


def test_lambda_bills_each_invocation_rounded_up_to_the_millisecond() -> None:
    parts = [record(0, {}, "x", duration_s=0.0004), record(0, {}, "x", duration_s=0.0004)]
    assert usage.lambda_usage(parts) == (prices.gb_seconds(0.0008, 1024), 1) == (0.001, 1)


def test_the_summary_carries_the_figures_and_the_price_file_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunRecord(
        run_id="r",
        status=RunStatus.COMPLETED,
        training=TrainingSpec(workers=1, reducers=1, iterations=3),
        iteration=3,
        workers=1,
        dataset="d",
        created_at=0.0,
        updated_at=10.0,
    )
    builtin = runs.summarize(run, [], 10.0, RECORDS)
    assert builtin.requests_per_iteration["s3:PutObject"] == 1 and builtin.cost_usd > 0
    price_file = tmp_path / "prices.json"
    price_file.write_text(json.dumps(PRICES.model_dump()))
    monkeypatch.setenv(prices.PRICES_ENV, str(price_file))
    overridden = runs.summarize(run, [], 10.0, RECORDS)
    assert overridden.cost_usd == pytest.approx(usage.figures(RECORDS, 3, PRICES)["cost_usd"])
    assert runs.summarize(run, [], 10.0).cost_usd is None  # no usage lines, no figures
