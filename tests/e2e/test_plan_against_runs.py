"""The plan against the real pipeline: ``predict``'s requests per iteration are the run summary's
(built from the functions' usage lines, as ``slsml run`` builds it), operation by operation; and ``bench
scale`` in miniature fits a calibration that ``slsml plan`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slsml.accounting import prices, usage
from slsml.bench import scale as bench_scale
from slsml.cli import options
from slsml.cli.main import build_parser, main
from slsml.client import demo, runs
from slsml.cost.modelinfo import from_keras_file
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.predict import predict
from slsml.cost.workload import Workload, function_memory, function_timeouts
from slsml.local.runtime import LocalRuntime
from slsml.pipeline.services import Services
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio
from tests.e2e.conftest import finish, train

# The median iteration is a steady one: only the first (cold containers: a worker's model holds the weights it
# starts from) and the last (the Merger assembles and saves the model the run ends on) differ. What a warm process
# reads when it first meets a run (run.json, the model file, the dataset's manifest and shards) is the run's, of no
# iteration, whichever iteration brings the run to it (``usage.warming``), so that the runs below, which share the
# warm processes, each have steady iterations between.
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
EXCHANGE_EXTRAS = {
    "dynamodb:UpdateItem": 2 + 3 + 1,
    "dynamodb:PutItem": 3,
    "dynamodb:BatchGetItem": 1,
    "s3:PutObject": 3,
    "s3:GetObject": 2,
    "sns:PublishBatch": 1,
}


SHAPES = [(4, 2, None, PLAIN_EXTRAS), (3, 3, None, PLAIN_EXTRAS), (3, 3, CLIPPED, EXCHANGE_EXTRAS)]


def _shape_run(workers: int, reducers: int, optimizer: OptimizerConfig | None) -> str:
    return f"plan-requests-{workers}x{reducers}" + ("-clip" if optimizer else "")


@pytest.mark.parametrize(
    ("workers", "reducers", "optimizer", "extras"), SHAPES, ids=["4x2", "3x3", "3x3-global-clipnorm"]
)
def test_the_plan_counts_the_requests_of_an_iteration(
    local: LocalRuntime,
    services: Services,
    started: None,
    cnn: Path,
    workers: int,
    reducers: int,
    optimizer: OptimizerConfig | None,
    extras: dict[str, int],
) -> None:
    run_id = _shape_run(workers, reducers, optimizer)
    run = finish(services, run_id, timeout_s=900)  # the runs share the machine
    assert run.status == "COMPLETED", run.reason
    assert local.host.wait_idle(run_id, 60)
    records = usage.read_local(local.log_dir, run_id)
    summary = runs.summarize(run, services.table.list_iterations(run_id), 0.0, records)

    figures = from_keras_file(cnn, batch=32, measure=False, parameters=Parameters())
    if optimizer:
        figures["optimizer"] = optimizer
    work = Workload(
        **figures,
        compute_per_sample_s=0.0,
        compute_source="not timed",
        workers=workers,
        reducers=reducers,
        global_batch=128,
        iterations=ITERATIONS,
        memory_mb=function_memory(),
        timeout_s=function_timeouts(),
    )
    plan = predict(work, Parameters(), Quotas(), prices.PriceTable())
    assert plan.requests_per_iteration == summary.requests_per_iteration
    measured, minimum = summary.requests_per_iteration, plan.minimum_requests_per_iteration
    beyond = {op: count - minimum[op] for op, count in measured.items() if count != minimum[op]}
    assert beyond == {**extras, "dynamodb:UpdateItem": extras["dynamodb:UpdateItem"] + workers}
    if optimizer is None:
        assert sum(measured.values()) <= 1.2 * sum(minimum.values())


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model ADMM applies to: softmax regression on the digits."""
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    path = tmp_path_factory.mktemp("model") / "linear.keras"
    path.write_bytes(modelio.save_model(model))
    return path


# each option of the update rules, compression and staleness, and a budget, as `run start` and `plan` take them
OPTIONS = {
    "average-k4": ["--algorithm", "average", "--local-steps", "4"],
    "average-keep": [
        "--algorithm",
        "average",
        "--local-steps",
        "2",
        "--local-state",
        "keep",
        "--local-momentum",
        "0.9",
    ],
    "fedopt": ["--algorithm", "average", "--local-steps", "2", "--server", "optimizer"],
    "admm": ["--algorithm", "admm", "--local-steps", "2"],
    # the plan prices a steady compressed round: each sparse encoding from the first iteration (no dense warm-up)
    "topk": ["--compress", "topk:0.01", "--compress-warmup", "0"],
    "fp16": ["--compress", "fp16"],
    "significance": ["--compress", "significance:0.01", "--compress-warmup", "0"],
    "sparse": ["--compress", "sparse"],
    "staleness": ["--staleness", "2"],
    "budget": ["--budget-usd", "1"],  # every invocation adds its cost to the run's spend; the launch reads it
}
SHAPE = ["--workers", "4", "--reducers", "2", "--batch", "128", "--iterations", str(ITERATIONS)]


def _option_model(name: str, cnn: Path, linear: Path) -> Path:
    return linear if "admm" in OPTIONS[name] else cnn


@pytest.fixture(scope="module")
def started(services: Services, digits, cnn: Path, linear: Path) -> None:
    """Every run of the tests below, started at once (runs do not disturb each other); each test waits for its own."""
    for workers, reducers, optimizer, _ in SHAPES:
        spec = TrainingSpec(
            workers=workers,
            reducers=reducers,
            global_batch=128,
            iterations=ITERATIONS,
            eval_every=0,
            optimizer=optimizer,
        )
        train(services, spec, _shape_run(workers, reducers, optimizer), cnn.read_bytes())
    for name in OPTIONS:
        model = _option_model(name, cnn, linear)
        flags = [*SHAPE, *OPTIONS[name]]
        args = build_parser().parse_args(["run", "start", "--model", str(model), "--data", "digits", *flags])
        spec = options.training_spec(args).model_copy(update={"eval_every": 0})
        train(services, spec, f"plan-options-{name}", model.read_bytes())


@pytest.mark.parametrize("name", OPTIONS)
def test_the_plan_counts_the_requests_of_every_update_rule_and_option(
    local: LocalRuntime,
    services: Services,
    started: None,
    cnn: Path,
    linear: Path,
    name: str,
    capsys,
) -> None:
    model = _option_model(name, cnn, linear)
    flags = [*SHAPE, *OPTIONS[name]]
    run_id = f"plan-options-{name}"
    run = finish(services, run_id, timeout_s=900)  # the runs share the machine
    assert run.status == "COMPLETED", run.reason
    assert local.host.wait_idle(run_id, 60)
    summary = runs.summarize(run, services.table.list_iterations(run_id), 0.0, usage.read_local(local.log_dir, run_id))

    capsys.readouterr()
    assert main(["plan", "--model", str(model), "--compute-per-sample", "0", *flags, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["requests_per_iteration"] == summary.requests_per_iteration
    minimum = plan["minimum_requests_per_iteration"]
    beyond = {
        op: count - minimum.get(op, 0)
        for op, count in summary.requests_per_iteration.items()
        if count != minimum.get(op, 0)
    }
    explained: dict[str, int] = {}
    for call in plan["extra_calls"]:
        explained[call["operation"]] = explained.get(call["operation"], 0) + call["count"]
    assert beyond == explained


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
    assert (
        main(
            [
                "plan",
                "--params",
                "2410",
                "--compute-per-sample",
                "1e-4",
                "--workers",
                "2",
                "--reducers",
                "2",
                "--calibration",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    parameters = json.loads(capsys.readouterr().out)["parameters"]
    for name, value in report.fitted.items():
        assert parameters[name] == {**parameters[name], "value": value, "source": "calibration fitted.json"}
