"""The plan against the real pipeline: ``costmodel.predict``'s requests per iteration are the run summary's
(built from the functions' usage lines, as ``slsml run`` builds it), operation by operation; and ``bench
scale`` in miniature fits a calibration that ``slsml plan`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slsml.accounting import prices, usage
from slsml.bench import scale as bench_scale
from slsml.cli.main import main
from slsml.client import demo, runs
from slsml.cost import model as costmodel
from slsml.cost.model import Parameters, Quotas, Workload
from slsml.local.runtime import LocalRuntime
from slsml.pipeline.services import Services
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio
from tests.e2e.conftest import finish, train

# The median iteration is a steady one: the first (cold containers), the last (a merger's first read of the
# test split) and the first turn of each warm process that the first iteration left idle (a worker, a
# reducer, a ReduceLauncher) make at most 4 others.
ITERATIONS = 9


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "cnn.keras"
    path.write_bytes(modelio.save_model(demo.digits_cnn(seed=1)))
    return path


CLIPPED = OptimizerConfig(name="adam", learning_rate=3e-3, global_clipnorm=0.1)
# beyond the minimum chain: a counter update per report and 2 more; with the norm exchange (R = 3) also
# per shard a record of its sums of squares, its count and its average (stored, and read back by the 2
# shards another one releases), the read of the sums, the release's claim and its message
PLAIN_EXTRAS = {"dynamodb:UpdateItem": 2}
EXCHANGE_EXTRAS = {"dynamodb:UpdateItem": 2 + 3 + 1, "dynamodb:PutItem": 3, "dynamodb:BatchGetItem": 1,
                   "s3:PutObject": 3, "s3:GetObject": 2, "sns:PublishBatch": 1}


@pytest.mark.parametrize(("workers", "reducers", "optimizer", "extras"), [
    (4, 2, None, PLAIN_EXTRAS), (3, 3, None, PLAIN_EXTRAS), (3, 3, CLIPPED, EXCHANGE_EXTRAS),
], ids=["4x2", "3x3", "3x3-global-clipnorm"])
def test_the_plan_counts_the_requests_of_an_iteration(
    local: LocalRuntime, services: Services, digits, cnn: Path, workers: int, reducers: int,
    optimizer: OptimizerConfig | None, extras: dict[str, int],
) -> None:
    run_id = f"plan-requests-{workers}x{reducers}" + ("-clip" if optimizer else "")
    spec = TrainingSpec(workers=workers, reducers=reducers, global_batch=128, iterations=ITERATIONS, eval_every=0,
                        optimizer=optimizer)
    train(services, spec, run_id, cnn.read_bytes())
    run = finish(services, run_id)
    assert run.status == "COMPLETED", run.reason
    assert local.host.wait_idle(run_id, 60)
    records = usage.read_local(local.log_dir, run_id)
    summary = runs.summarize(run, services.table.list_iterations(run_id), 0.0, records)

    figures = costmodel.from_keras_file(cnn, batch=32, measure=False, parameters=Parameters())
    if optimizer:
        figures["optimizer"] = optimizer
    work = Workload(**figures, compute_per_sample_s=0.0, compute_source="not timed", workers=workers,
                    reducers=reducers, global_batch=128, iterations=ITERATIONS, memory_mb=costmodel.function_memory(),
                    timeout_s=costmodel.function_timeouts())
    plan = costmodel.predict(work, Parameters(), Quotas(), prices.PriceTable())
    assert plan.requests_per_iteration == summary.requests_per_iteration
    measured, minimum = summary.requests_per_iteration, plan.minimum_requests_per_iteration
    beyond = {op: count - minimum[op] for op, count in measured.items() if count != minimum[op]}
    assert beyond == {**extras, "dynamodb:UpdateItem": extras["dynamodb:UpdateItem"] + workers}
    if optimizer is None:
        assert sum(measured.values()) <= 1.2 * sum(minimum.values())


def test_bench_scale_fits_a_calibration_the_plan_reads(local: LocalRuntime, digits, tmp_path: Path, capsys) -> None:
    report = bench_scale.scale(local, workers=(2,), reducers=(2,), iterations=3)
    (point,) = report.points
    assert (point.workers, point.reducers, point.status) == (2, 2, "COMPLETED")
    assert point.steady_iterations == 1
    assert tuple(point.measured_stages) == tuple(point.predicted_stages) == bench_scale.STAGES
    assert sum(point.measured_stages.values()) == pytest.approx(point.measured_iteration_s)
    assert point.predicted_requests.keys() == point.measured_requests.keys()
    assert point.minimum_requests.keys() == point.measured_requests.keys()
    assert point.over_minimum == sum(point.measured_requests.values()) / sum(point.minimum_requests.values()) > 1
    assert report.pools == local.concurrency
    assert report.max_error == abs(point.error) < 1

    path = tmp_path / "fitted.json"
    bench_scale.write_calibration(report, path)
    capsys.readouterr()
    assert main(["plan", "--params", "2410", "--compute-per-sample", "1e-4", "--workers", "2", "--reducers", "2",
                 "--calibration", str(path), "--json"]) == 0
    parameters = json.loads(capsys.readouterr().out)["parameters"]
    for name, value in report.fitted.items():
        assert parameters[name] == {**parameters[name], "value": value, "source": "calibration fitted.json"}
