"""bench scale's arithmetic: the stages read from usage lines, the model in the local runtime's waves, and the
least-squares fit of the model's latencies."""

from __future__ import annotations

import json
import math

import pytest

from slsml.accounting import prices
from slsml.accounting.usage import UsageRecord
from slsml.bench import scale as bench_scale
from slsml.bench.scale import STAGES
from slsml.cost import predict as costmodel
from slsml.cost.modelinfo import from_params
from slsml.cost.parameters import Parameters, Quotas, load_overrides
from slsml.cost.plan import Plan
from slsml.cost.workload import PIPELINE, Workload, function_timeouts

ONE_PROCESS = dict.fromkeys(PIPELINE, 1)


def workload(workers: int, reducers: int) -> Workload:
    figures = from_params(2410, Parameters(), compute_per_sample_s=1e-4)
    return Workload(
        **figures,
        workers=workers,
        reducers=reducers,
        global_batch=128,
        iterations=6,
        memory_mb=dict.fromkeys(PIPELINE, 1769),
        timeout_s=function_timeouts(),
    )


def predict(work: Workload, parameters: Parameters) -> Plan:
    return costmodel.predict(work, parameters, Quotas(), prices.PriceTable())


def test_workers_beyond_the_pool_run_in_waves_after_the_first_work_message() -> None:
    plan = predict(workload(16, 3), Parameters())
    stages = {stage.name: stage.seconds for stage in plan.stages}
    publish = Parameters().sns_publish_s  # 16 Work messages: two batches, the first one publish before the last
    waves = bench_scale.local_stages(plan, ONE_PROCESS | {"worker": 4, "reducer": 2}, dispatch_s=0.25)
    assert waves["Work → Worker"] == pytest.approx(stages["Work → Worker"] - publish)
    assert waves["Worker"] == pytest.approx(4 * stages["Worker"] + 3 * 0.25)
    assert waves["Reduce → Reducer"] == stages["Reduce → Reducer"]  # 3 Reduce messages: one batch
    assert waves["Reducer"] == pytest.approx(2 * stages["Reducer"] + 0.25)
    unchanged = set(STAGES) - {"Work → Worker", "Worker", "Reducer"}
    assert {name: waves[name] for name in unchanged} == {name: stages[name] for name in unchanged}
    enough = bench_scale.local_stages(plan, ONE_PROCESS | {"worker": 16, "reducer": 3}, dispatch_s=0.25)
    assert enough["Worker"] == pytest.approx(publish + stages["Worker"])  # the 16th worker's message came last
    assert math.fsum(enough.values()) == pytest.approx(plan.chain_s)


def test_the_fit_finds_the_latencies_that_made_the_stages() -> None:
    truth = {
        "handler_s": 0.004,
        "dynamodb_s": 0.006,
        "s3_request_s": 0.012,
        "sns_publish_s": 0.02,
        "sns_lambda_s": 0.015,
        "1/s3_mb_s": 1 / 150,
        "dispatch_s": 0.01,
        "s3_parallel_reads": 4,
    }
    assert set(truth) == {*bench_scale.UNKNOWNS, "s3_parallel_reads"}
    grid = [workload(w, r) for w in bench_scale.WORKERS for r in bench_scale.REDUCERS]
    made = [bench_scale.predicted_stages(work, truth, ONE_PROCESS) for work in grid]
    fitted = bench_scale.fit(grid, made, [sum(stages.values()) for stages in made], ONE_PROCESS)
    assert fitted == pytest.approx(truth, rel=1e-6)


def test_the_calibration_is_what_plan_reads(tmp_path) -> None:
    values = dict.fromkeys(bench_scale.UNKNOWNS, 0.01) | {
        "1/s3_mb_s": 0.0,
        "s3_parallel_reads": 2,
    }
    report = bench_scale.ScaleReport(
        model="m",
        params=1,
        batch=1,
        iterations=3,
        pools={},
        points=[],
        fitted=bench_scale.calibration(values),
        dispatch_s=0.01,
        median_error=0,
        max_error=0,
    )
    path = tmp_path / "fitted.json"
    bench_scale.write_calibration(report, path)
    parameters, origin = load_overrides(path, [], Parameters)
    assert json.loads(path.read_text()).keys() == origin.keys()
    assert "dispatch_s" not in origin  # the local runtime's, not the model's
    assert parameters.s3_request_s == parameters.handler_s == 0.01
    assert parameters.s3_read_mb_s == parameters.s3_write_mb_s == bench_scale.UNBOUNDED_MB_S
    assert parameters.s3_parallel_reads == 2


def record(function: str, iteration: int, start: float, end: float, *operations: str) -> UsageRecord:
    return UsageRecord(
        run_id="r",
        iteration=iteration,
        function=function,
        start=start,
        end=end,
        duration_s=end - start,
        memory_mb=512,
        requests=dict.fromkeys(operations, 1),
    )


def iteration(i: int, at: float, fires: bool = True) -> list[UsageRecord]:
    """One iteration's invocations: 2 workers, 2 reducers, from ``at`` on (10 ms steps)."""
    t = [at + k / 100 for k in range(20)]
    records = [
        record("work_launcher", i, t[0], t[1], "dynamodb:GetItem", "sns:PublishBatch"),
        record("worker", i, t[2], t[4], "s3:GetObject"),
        record("worker", i, t[3], t[6], "s3:GetObject"),
        record("reduce_launcher", i, t[5], t[6], "dynamodb:PutItem"),
        record("reducer", i, t[9], t[11], "s3:GetObject"),
        record("reducer", i, t[10], t[13], "s3:GetObject"),
        record("merger", i, t[12], t[13], "dynamodb:UpdateItem"),
        record("merger", i, t[14], t[16], "s3:PutObject"),
    ]
    if fires:
        records.append(record("reduce_launcher", i, t[7], t[8], "dynamodb:BatchGetItem"))
    return records


def test_the_stages_of_a_steady_iteration_tile_it() -> None:
    records = [
        *iteration(0, 0.0),
        *iteration(1, 1.0),
        *iteration(2, 2.0, fires=False),
        *iteration(3, 3.0),
        *iteration(4, 4.0),
    ]
    measured = bench_scale.measured_stages(records, iterations=5, participants=2)
    assert len(measured) == 2  # iterations 1 and 3: 0 is cold, 2 fired at no ReduceLauncher, 4 is the last
    for stages in measured:
        assert tuple(stages) == STAGES
        assert math.fsum(stages.values()) == pytest.approx(1.0)  # WorkLauncher start to the next one's
        assert stages == pytest.approx(
            {
                "model → WorkLauncher": 0.84,
                "WorkLauncher": 0.01,
                "Work → Worker": 0.01,
                "Worker": 0.04,
                "WorkDone → ReduceLauncher": 0.01,
                "ReduceLauncher (fires)": 0.01,
                "Reduce → Reducer": 0.01,
                "Reducer": 0.04,
                "ReduceDone → Merger": 0.01,
                "Merger (merges)": 0.02,
            }
        )
    assert bench_scale.measured_stages(records, iterations=5, participants=3) == []  # fewer workers than n


def test_a_stage_that_overlaps_the_next_ends_where_the_next_began() -> None:
    """The firing ReduceLauncher publishes the Reduce messages before it marks the counter: a reducer starts
    before the fire's invocation ends, and the first worker before the WorkLauncher's ends."""
    records = [*iteration(0, 0.0), *iteration(1, 1.0), *iteration(2, 2.0)]
    late = {("reduce_launcher", "dynamodb:BatchGetItem"): 0.035, ("work_launcher", "dynamodb:GetItem"): 0.025}
    records = [
        r.model_copy(update={"end": r.end + late.get((r.function, next(iter(r.requests))), 0)})
        if r.iteration == 1
        else r
        for r in records
    ]
    (stages,) = bench_scale.measured_stages(records, iterations=3, participants=2)
    assert min(stages.values()) >= 0
    assert math.fsum(stages.values()) == pytest.approx(1.0)
    assert stages["Reduce → Reducer"] == stages["Work → Worker"] == 0
    assert stages["ReduceLauncher (fires)"] == pytest.approx(0.02)  # until the first reducer began
    assert stages["WorkLauncher"] == pytest.approx(0.02)
