"""slsml plan of GPU workers (Lambda Managed Instances): their dollars as the instances, the management fee, the
requests and the VPC endpoints bill them, the instances W environments take, their time as the model's training FLOPs
over the card's published peak × the fraction of it achieved (a calibration of that card, else an estimate), and the
CLI that sets them beside CPU workers and one machine."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from slsml.accounting import prices
from slsml.cli.main import main
from slsml.cost import cards, gpuworker
from slsml.cost import predict as costmodel
from slsml.cost.calibration import GpuCalibration, GpuThroughput
from slsml.cost.modelinfo import from_params
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import FunctionFigures, Plan
from slsml.cost.recommend import as_fast_as
from slsml.cost.vm import VmComparison, compare_vm, gpu_busy, lambda_run
from slsml.cost.workload import Accelerator, Workload, function_memory, function_timeouts
from slsml.pipeline import tuner
from slsml.rounds import ahead, sizing
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec
from slsml.spec.deployment import ENDPOINT_AZS, GPU_INSTANCES, GPU_WORKER_DEFAULTS, INTERFACE_ENDPOINTS
from slsml.spec.errors import BadInputError, RunFailed
from slsml.spec.limits import RunLimits
from slsml.spec.shardplan import ShardPlan, VariableSpec

PRICES = prices.PriceTable()
P = Parameters()
RESNET = 25_600_000


def workload(workers: int = 4, compute_per_sample_s: float = 0.01, params: int = RESNET, **changes) -> Workload:
    """A ResNet-50-sized model (or one of ``params``) whose CPU rounds fit one invocation."""
    fields = from_params(params, P, compute_per_sample_s) | {
        "workers": workers,
        "reducers": 4,
        "global_batch": 1024,
        "iterations": 50,
        "samples": 51_200,
        "memory_mb": function_memory(),
        "timeout_s": function_timeouts(),
    }
    return Workload(**(fields | changes))


def gpu(
    work: Workload, gib: int = 24, instance: str | None = "g5.xlarge", calibration: GpuCalibration | None = None
) -> Accelerator:
    types = (instance,) if instance else tuple(n for n, k in PRICES.gpu_instances.items() if k.gpu_memory_gib >= gib)
    return gpuworker.accelerator(gib, work, P, PRICES, calibration, "calibration.json", types)


def on_gpu(
    work: Workload, gib: int = 24, instance: str | None = "g5.xlarge", calibration: GpuCalibration | None = None
) -> Workload:
    """``work`` on GPU workers of the GPU function's default memory (a multiple of 2,048 MB)."""
    memory = function_memory({"worker": GPU_WORKER_DEFAULTS["memory_mb"]})
    return work.at(accelerator=gpu(work, gib, instance, calibration), memory_mb=memory)


def predict(work: Workload) -> Plan:
    return costmodel.predict(work, P, Quotas(), PRICES)


def function(plan: Plan, name: str) -> FunctionFigures:
    return next(f for f in plan.functions if f.function == name)


def calibration(card: str, *entries: tuple[int, float], precision: str = "float32") -> GpuCalibration:
    """What `slsml bench gpu` writes on ``card``: ResNet-50's fraction of the card's peak at each (GiB, fraction)."""
    return GpuCalibration(
        card=card,
        model="ResNet50 224x224x3",
        params=cards.RESNET50_PARAMS,
        train_flops_per_sample=cards.RESNET50_TRAIN_FLOPS,
        sample_shape=(224, 224, 3),
        measured_at="2026-11-27T00:00:00+00:00",
        entries=tuple(
            GpuThroughput(
                accelerator_gib=gib,
                precision=precision,
                micro_batch=64,
                samples_per_s=100.0,
                achieved_fraction=fraction,
            )
            for gib, fraction in entries
        ),
    )


def estimate(precision: str = "float32") -> float:
    """The fraction of a card's peak the plan takes where none was measured."""
    return cards.estimated_fraction(precision, "g6.xlarge").value  # type: ignore[arg-type]


def peak(card: str, precision: str = "float32") -> float:
    """The card's published peak, FLOPS."""
    sheet = cards.datasheet(card)
    assert sheet is not None
    return sheet.tflops(precision) * 1e12  # type: ignore[arg-type,operator]


# ---- dollars ------------------------------------------------------------------------------------------------------


def test_gpu_workers_bill_their_instances_fee_requests_and_endpoints_not_gb_seconds() -> None:
    cpu_work = workload()
    cpu, gpu = predict(cpu_work), predict(on_gpu(cpu_work))
    g5 = PRICES.gpu_instances["g5.xlarge"]
    hours = gpu.iteration_s / 3600
    instances = math.ceil(cpu_work.workers / (g5.gpus * (g5.gpu_memory_gib // 24)))
    capacity = instances * g5.dollars_per_hour * hours * (1 + PRICES.managed_instances_fee)
    endpoints = len(INTERFACE_ENDPOINTS) * ENDPOINT_AZS * PRICES.vpc_endpoint_hour * hours
    assert function(gpu, "worker").gb_seconds == 0 < function(cpu, "worker").gb_seconds
    assert gpu.requests_per_iteration == cpu.requests_per_iteration  # the same chain, the worker's bill apart
    worker_gb_dollars = function(cpu, "worker").gb_seconds * PRICES.lambda_gb_second
    # what the endpoints charge per GB (a few kB of the workers' messages and logs) stays under a micro-dollar
    assert gpu.iteration_dollars == pytest.approx(
        cpu.iteration_dollars - worker_gb_dollars + capacity + endpoints, abs=1e-6
    )
    invocations = sum(f.invocations for f in gpu.functions)
    others = sum(f.gb_seconds for f in gpu.functions if f.function != "worker")
    assert gpu.dollars_per_iteration["lambda"] == pytest.approx(
        others * PRICES.lambda_gb_second + invocations * PRICES.lambda_request
    )


def test_the_scale_up_before_the_first_iteration_is_billed_and_waited_for() -> None:
    work = on_gpu(workload())
    base, later = predict(work), costmodel.predict(work, P.model_copy(update={"gpu_scale_up_s": 900}), Quotas(), PRICES)
    more_s = 900 - P.gpu_scale_up_s
    g5 = PRICES.gpu_instances["g5.xlarge"]
    per_hour = (
        work.workers * g5.dollars_per_hour * (1 + PRICES.managed_instances_fee)
        + len(INTERFACE_ENDPOINTS) * ENDPOINT_AZS * PRICES.vpc_endpoint_hour
    )
    assert later.run_s - base.run_s == pytest.approx(more_s)
    assert later.run_dollars - base.run_dollars == pytest.approx(per_hour * more_s / 3600)
    assert later.iteration_dollars == base.iteration_dollars


@pytest.mark.parametrize(
    ("instance", "gib"), [("g5.xlarge", 6), ("g5.xlarge", 12), ("g5.xlarge", 24), ("g6.12xlarge", 24)]
)
def test_more_workers_than_fit_one_instance_need_more_instances(instance: str, gib: int) -> None:
    kind = PRICES.gpu_instances[instance]
    l4 = calibration("NVIDIA L4", (24, 0.3))
    fit = kind.gpus * (kind.gpu_memory_gib // gib)
    for workers in range(1, 2 * fit + 2):
        plan = predict(on_gpu(workload(workers=workers), gib, instance, l4))
        billed = plan.dollars_per_iteration["ec2"] / (kind.dollars_per_hour * plan.iteration_s / 3600)
        # the instances the workers take, and no fewer than the three Lambda launches for AZ resiliency
        assert billed == pytest.approx(max(3, math.ceil(workers / fit))), (workers, fit)


# ---- throughput ---------------------------------------------------------------------------------------------------


def test_a_gpu_workers_time_is_the_models_flops_over_the_cards_peak_times_the_achieved_fraction() -> None:
    work = workload().at(train_flops_per_sample=6e9)
    a10g = calibration("NVIDIA A10G", (24, 0.5))
    samples = 256
    with_calibration = gpuworker.KIND.compute_s(on_gpu(work, calibration=a10g), P, samples)
    without = gpuworker.KIND.compute_s(on_gpu(work), P, samples)
    assert with_calibration == pytest.approx(samples * 6e9 / (62.5e12 * 0.5))  # the A10G's float32: TF32, 62.5 TFLOPS
    assert without == pytest.approx(samples * 6e9 / (62.5e12 * estimate()))
    # a model of no counted FLOPs: estimated from its weights as ResNet-50's are
    unknown = gpuworker.KIND.compute_s(on_gpu(workload(), calibration=a10g), P, samples)
    assert unknown == pytest.approx(samples * RESNET * P.train_flops_per_param_sample / (62.5e12 * 0.5))
    # the default fraction: an A10's published ResNet-50 training throughput × its FLOPs over the A10's peak
    assert estimate() == pytest.approx(349 * cards.RESNET50_TRAIN_FLOPS / 62.5e12)
    assert estimate("mixed_float16") == pytest.approx(638 * cards.RESNET50_TRAIN_FLOPS / 125e12)


def test_a_calibration_of_one_card_is_never_applied_to_another() -> None:
    work = workload()
    l4 = calibration("NVIDIA L4", (24, 0.9))
    on_a10g = gpuworker.KIND.compute_s(on_gpu(work, calibration=l4), P, 100)
    assert on_a10g == gpuworker.KIND.compute_s(on_gpu(work), P, 100)  # the A10G's estimate, not the L4's measure
    on_l4 = on_gpu(work, instance="g6.xlarge", calibration=l4)
    assert on_l4.accelerator is not None and on_l4.accelerator.fraction == 0.9
    assert on_l4.accelerator.source.startswith("measured on NVIDIA L4 by slsml bench gpu (calibration.json")
    with pytest.raises(BadInputError, match=r"measured on NVIDIA L4, not on the NVIDIA A10G of g5\.xlarge") as refused:
        gpuworker.check_calibration(l4, "l4.json", ("g5.xlarge",))
    assert len(str(refused.value).splitlines()) == 1 and "`slsml bench gpu` on a g5.xlarge" in str(refused.value)
    gpuworker.check_calibration(l4, "l4.json", ("g5.xlarge", "g6.xlarge"))  # one of the types has its card
    with pytest.raises(BadInputError, match="no mixed_bfloat16 peak is published of NVIDIA T4"):  # no bfloat16
        on_gpu(work.at(training=TrainingSpec(mixed_precision="mixed_bfloat16")), 12, instance="g4dn.xlarge")


def test_a_share_of_a_gpu_gets_that_share_of_its_compute_and_no_more_than_it_measured_alone() -> None:
    work = workload()
    roomy = calibration("NVIDIA A10G", (24, 0.4), (6, 0.2))
    cramped = calibration("NVIDIA A10G", (24, 0.4), (6, 0.05))
    assert gpu(work, 6, calibration=roomy).environment_fraction == pytest.approx(0.4 * 6 / 24)
    assert gpu(work, 6, calibration=cramped).environment_fraction == 0.05
    assert gpu(work, 12).environment_fraction == pytest.approx(estimate() / 2)


def test_mixed_precision_workers_take_the_cards_tensor_peak() -> None:
    work = workload()
    mixed = work.at(training=TrainingSpec(mixed_precision="mixed_float16"))
    ratio = gpuworker.KIND.compute_s(on_gpu(work), P, 100) / gpuworker.KIND.compute_s(on_gpu(mixed), P, 100)
    assert ratio == pytest.approx(125 * estimate("mixed_float16") / (62.5 * estimate()))


def test_the_instance_type_chosen_is_the_cheapest_fleet_per_sample() -> None:
    l4 = calibration("NVIDIA L4", (24, 0.15))
    for workers in (1, 3, 4, 5):
        work = workload(workers=workers)
        costs = {}
        for name, kind in PRICES.gpu_instances.items():
            if kind.gpu_memory_gib >= 24:
                seconds = gpuworker.seconds_per_sample(work.at(accelerator=gpu(work, 24, name, l4)), P)
                fleet = max(3, math.ceil(workers / (kind.gpus * (kind.gpu_memory_gib // 24))))
                costs[name] = fleet * kind.dollars_per_hour * seconds
        assert gpu(work, 24, None, l4).instance == min(costs, key=costs.__getitem__), workers


def test_every_gpu_instance_types_card_has_a_datasheet() -> None:
    for name, kind in GPU_INSTANCES.items():
        sheet = cards.datasheet(kind.card)
        assert sheet is not None and sheet.memory_gib == kind.gpu_memory_gib, name
    # as nvidia-smi names the cards where it names them otherwise
    assert cards.datasheet("Tesla T4") == cards.datasheet("NVIDIA T4") is not None
    assert cards.datasheet("NVIDIA H100 80GB HBM3") == cards.datasheet("NVIDIA H100") is not None
    assert cards.datasheet("NVIDIA B200") is None


# ---- the CLI ------------------------------------------------------------------------------------------------------


def plan_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("given", ["worker=5", "worker=25", "reducer=24", "worker"])
def test_an_accelerator_lambda_does_not_offer_is_refused_in_one_line(capsys: pytest.CaptureFixture, given: str) -> None:
    assert main(["plan", "--params", "100000", "--iterations", "3", "--accelerator", given]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--accelerator" in err, err


def test_the_json_sets_cpu_and_gpu_workers_and_their_machine_side_by_side(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no calibration file but the one given
    argv = ("--params", "2000000", "--workers", "8", "--batch", "1024", "--samples", "20480", "--epochs", "1")
    out = plan_json(capsys, *argv, "--accelerator", "worker=12")
    cpu = plan_json(capsys, *argv)
    assert (out["worker"]["kind"], out["cpu_plan"]["worker"]["kind"]) == ("gpu", "cpu")
    assert out["cpu_plan"]["dollars"] == cpu["dollars"]  # the CPU workers as a plan without --accelerator prices them
    assert out["workload"]["accelerator"]["gib"] == 12
    cpu_side, gpu_side, machine, machines = out["side_by_side"]
    assert cpu_side["epoch_dollars"] == out["cpu_plan"]["dollars"]["epoch"]
    assert gpu_side["epoch_dollars"] == out["dollars"]["epoch"]
    vm = out["compare_vm"]
    assert machine["epoch_s"] == pytest.approx(20480 / vm["samples_per_s"])
    assert machine["epoch_dollars"] == pytest.approx(machine["epoch_s"] / 3600 * vm["dollars_per_hour"])
    # per whole run: the GPU workers' plan and what Lambda Managed Instances bill past it; the machine's start-up
    assert gpu_side["run_dollars"] == pytest.approx(out["dollars"]["run"] + sum(vm["run"]["lambda_extras"].values()))
    assert (machine["run_s"], machine["run_dollars"]) == (vm["run"]["seconds"], vm["run"]["dollars"])
    for side in (cpu_side, gpu_side, machines):
        assert side["dollars_vs_machine"] == pytest.approx(side["run_dollars"] / machine["run_dollars"])
        assert side["time_vs_machine"] == pytest.approx(side["run_s"] / machine["run_s"])
    # 8 workers of 12 GiB take 4 GPUs: at equal GPUs, 4 machines of one GPU each
    assert machines["what"] == f"4 × {vm['machine']}, data-parallel" and vm["machines"]["count"] == 4
    # the default machine: one of the workers' instance type, each GPU at the throughput the plan gives the workers
    instance = out["workload"]["accelerator"]["instance"]
    kind = PRICES.gpu_instances[instance]
    environments = kind.gpus * kind.gpu_memory_gib // 12
    gpu_rate = 1 / gpuworker.seconds_per_sample(Workload.model_validate(out["workload"]), P)
    assert vm["samples_per_s"] == pytest.approx(environments * gpu_rate)
    assert vm["dollars_per_hour"] == kind.dollars_per_hour
    given = plan_json(capsys, *argv, "--accelerator", "worker=12", "--compare-vm", "900:2.5:my box")
    assert (given["compare_vm"]["machine"], given["side_by_side"][-1]["epoch_s"]) == ("my box", 20480 / 900)
    assert given["compare_vm"]["machines"] is None  # not the workers' instance type: no GPUs to equal


def test_the_acceptance_epoch_against_one_machine(capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch) -> None:
    """The ResNet-50 epoch of docs/cost.md: its figures are the plan's, and the machine's follow from the card."""
    monkeypatch.chdir(tmp_path)
    out = plan_json(
        capsys,
        *("--params", "25600000", "--compute-per-sample", "0.1", "--sample-bytes", "150528", "--batch", "8192"),
        *("--epochs", "1", "--samples", "1281167", "--accelerator", "worker=24", "--workers", "4"),
    )
    cpu_side, gpu_side, machine, machines = out["side_by_side"]
    # g6.xlarge, the instance the stack deploys: one L4, its 60 TFLOPS float32 (as TF32) at the estimated fraction,
    # over the model's training FLOPs (estimated from its weights)
    rate = 60e12 * estimate() / (25_600_000 * P.train_flops_per_param_sample)
    assert out["compare_vm"]["machine"] == "g6.xlarge"
    assert out["compare_vm"]["samples_per_s"] == pytest.approx(rate)
    assert machine["epoch_dollars"] == pytest.approx(
        1281167 / rate / 3600 * PRICES.gpu_instances["g6.xlarge"].dollars_per_hour
    )
    assert "estimate" in out["compare_vm"]["source"] and "`slsml bench gpu`" in out["compare_vm"]["source"]
    assert gpu_side["epoch_s"] == pytest.approx(out["iterations_per_epoch"] * out["iteration_s"])
    # GPU workers: at most the machine's time (micro-batches of the accelerator's memory, block-ordered reads
    # overlapping compute, an instance's S3 rate); their dollars are what docs/cost.md reports, with what binds them
    assert gpu_side["time_vs_machine"] <= 1 < gpu_side["dollars_vs_machine"]
    assert gpu_side["dollars_vs_machine"] == pytest.approx(gpu_side["run_dollars"] / machine["run_dollars"])
    assert gpu_side["epoch_dollars"] < cpu_side["epoch_dollars"] and gpu_side["epoch_s"] < cpu_side["epoch_s"]
    # the machine's whole run: its start-up, then its samples (its data, streamed at its network rate, hidden)
    run = out["compare_vm"]["run"]
    samples = out["workload"]["iterations"] * 8192
    # its first batch, over 16 connections of 85 MB/s within the instance's 10 Gbps
    assert run["machine_data_s"] == pytest.approx(8192 * 150528 / min(P.s3_parallel_reads * 85e6, 10e9 / 8))
    assert run["seconds"] == pytest.approx(P.vm_start_s + run["machine_data_s"] + samples / rate)
    # four machines at equal GPUs: a quarter of each batch, then a ring all-reduce of the gradients at 10 Gbps
    allreduce = 2 * 3 / 4 * 4 * 25_600_000 / (10e9 / 8)
    assert out["compare_vm"]["machines"]["allreduce_s"] == pytest.approx(allreduce)
    assert machines["epoch_s"] == pytest.approx(out["iterations_per_epoch"] * (2048 / rate + allreduce))
    assert 0 < run["gpu_busy"] < 1


def test_the_plan_prices_the_instance_type_the_deployment_allows_with_its_cards_published_figures(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no calibration file
    out = plan_json(capsys, "--params", "2000000", "--iterations", "3", "--accelerator", "worker=24")
    assert out["workload"]["accelerator"]["instance"] == GPU_WORKER_DEFAULTS["instance_types"][0]
    assert out["workload"]["memory_mb"]["worker"] == GPU_WORKER_DEFAULTS["memory_mb"]  # a GPU worker's, not 3,008
    facts = {fact["name"]: fact for fact in out["worker"]["facts"]}
    card = facts["card"]
    assert card["value"].startswith(
        "NVIDIA L4: 30.3 TFLOPS float32 (60 as TF32 on its tensor cores), 121 TFLOPS float16 tensor (dense), 24 GB"
    )
    assert card["source"].startswith("NVIDIA L4 datasheet, https://www.nvidia.com/")
    fraction = facts["achieved fraction"]
    assert fraction["source"].startswith("estimate: ") and "`slsml bench gpu` on a g6.xlarge" in fraction["source"]
    assert fraction["value"].startswith(f"{estimate():.3g} of the card's 60 TFLOPS float32 peak")
    assert "aws.amazon.com/ec2/pricing" in facts["on-demand price"]["source"]
    # a deployment naming another type is priced on it
    limits = RunLimits().with_worker_accelerator(24, ("g5.2xlarge",))
    assert gpuworker.deployed(workload(), P, PRICES, limits).accelerator.instance == "g5.2xlarge"


def test_a_gpu_worker_the_stack_refuses_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    argv = ["plan", "--params", "2000000", "--iterations", "3", "--accelerator", "worker=24"]
    for memory, reason in ((10240, "(5 vCPUs): more than a g6.xlarge"), (3008, "a multiple of 2048 MB")):
        assert main([*argv, "--memory", f"worker={memory}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--memory worker={memory}" in err and reason in err, err
    assert main([*argv, "--memory", "worker=8192"]) == 0


# ---- the cheapest W and R as fast as the machine -------------------------------------------------------------------

ACCEPTANCE = (
    *("--params", "25600000", "--compute-per-sample", "0.1", "--sample-bytes", "150528", "--batch", "8192"),
    *("--epochs", "1", "--samples", "1281167"),
)


def acceptance_on_gpu() -> Workload:
    """The acceptance epoch's workload on whole A10Gs of g5.xlarge."""
    return on_gpu(
        workload(compute_per_sample_s=0.1, global_batch=8192, iterations=157, samples=1_281_167, sample_bytes=150_528)
    )


def machine_of(work: Workload, samples_per_s: float | None = None) -> VmComparison:
    """The plan of ``work`` against one machine of its instance type (or of ``samples_per_s``)."""
    plan = predict(work)
    rate, dollars_per_hour, name, source = gpuworker.machine(work, P, PRICES)
    return compare_vm(plan, name, samples_per_s or rate, dollars_per_hour, source, P, PRICES)


def grid(work: Workload) -> list[tuple[int, int, float, float]]:
    """(W, R, seconds, dollars) of a whole run over a small W × R grid, each priced on its own, within Lambda's
    limits."""
    priced = (predict(work.at(workers=w, reducers=r)) for w in range(1, 9) for r in (4, 16, 32, 64, 80))
    return [
        (plan.workload.workers, plan.workload.reducers, *lambda_run(plan, P, PRICES)[:2])
        for plan in priced
        if not plan.violations
    ]


def test_the_cheapest_w_and_r_as_fast_as_the_machine_is_no_dearer_than_any_other_as_fast() -> None:
    work = acceptance_on_gpu()
    vm = machine_of(work)
    match = as_fast_as(work, vm, P, Quotas(), PRICES)
    assert match is not None and match.as_fast and match.seconds <= vm.run.seconds
    chosen = predict(work.at(workers=match.workers, reducers=match.reducers))
    assert lambda_run(chosen, P, PRICES)[:2] == (match.seconds, match.dollars)
    assert (match.time_vs_machine, match.dollars_vs_machine) == (
        match.seconds / vm.run.seconds,
        match.dollars / vm.run.dollars,
    )
    points = grid(work)
    as_fast = [dollars for _, _, seconds, dollars in points if seconds <= vm.run.seconds]
    assert len(as_fast) > 1 and len(as_fast) < len(points)  # the machine's time rules some out, and leaves a choice
    assert match.dollars <= min(as_fast)
    assert match.dollars < max(dollars for *_, dollars in points)  # the least, not any as fast


def test_against_a_machine_faster_than_any_w_and_r_the_fastest_is_named() -> None:
    work = acceptance_on_gpu()
    vm = machine_of(work, samples_per_s=1e6)
    match = as_fast_as(work, vm, P, Quotas(), PRICES)
    assert match is not None and not match.as_fast and match.time_vs_machine > 1
    assert match.seconds <= min(seconds for _, _, seconds, _ in grid(work))
    assert match.workers <= 8 and match.searched == "W 1–8 and R 1–256"


def test_without_workers_the_gpu_plan_is_of_the_cheapest_w_and_r_as_fast_as_its_machine(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no calibration file
    chosen = plan_json(capsys, *ACCEPTANCE, "--accelerator", "worker=24")
    # the GPU function's default memory, not the CPU worker's 3,008 MB (a GPU function's is a multiple of 2,048)
    assert chosen["workload"]["memory_mb"]["worker"] == GPU_WORKER_DEFAULTS["memory_mb"]
    given = plan_json(capsys, *ACCEPTANCE, "--accelerator", "worker=24", "--memory", "worker=6144")
    assert given["workload"]["memory_mb"]["worker"] == 6144
    match = chosen["recommendation"]["as_fast_as_machine"]
    assert match["as_fast"] and match["priced"]
    assert (chosen["workload"]["workers"], chosen["workload"]["reducers"]) == (match["workers"], match["reducers"])
    run = chosen["compare_vm"]["run"]
    assert (run["lambda_seconds"], run["lambda_dollars"]) == (match["seconds"], match["dollars"])
    # its cards would wait for the chain more than a tenth of the iteration: the plan chose stale weights too
    assert chosen["workload"]["training"]["stale_weights"] == match["stale_weights"] == 1
    line = chosen["verdict"]["recommendations"][-1]
    assert line == (
        f"as fast as g6.xlarge for least: --workers {match['workers']} --reducers {match['reducers']}"
        f" --stale-weights 1 (the plan's): {match['time_vs_machine']:.3g}× its time for"
        f" {match['dollars_vs_machine']:.3g}× its dollars"
    )
    synchronous = plan_json(capsys, *ACCEPTANCE, "--accelerator", "worker=24", "--stale-weights", "0")
    assert synchronous["workload"]["training"].get("stale_weights", 0) == 0
    assert synchronous["compare_vm"]["run"]["lambda_dollars"] > run["lambda_dollars"]
    # --workers given: the plan stays at it, and the match is only recommended
    asked = plan_json(capsys, *ACCEPTANCE, "--accelerator", "worker=24", "--workers", "6")
    assert asked["workload"]["workers"] == 6 and not asked["recommendation"]["as_fast_as_machine"]["priced"]
    assert asked["recommendation"]["as_fast_as_machine"]["searched"].startswith("W 1–8 ")
    synchronous_match = synchronous["recommendation"]["as_fast_as_machine"]
    assert {k: v for k, v in asked["recommendation"]["as_fast_as_machine"].items() if k != "priced"} == {
        k: v for k, v in synchronous_match.items() if k != "priced"
    }
    assert main(["plan", *ACCEPTANCE, "--accelerator", "worker=24"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # as the terminal's width wraps it
    assert f"W {match['workers']} · R {match['reducers']} (W and R chosen: the cheapest of W 1–8 and R 1–256 as" in text
    assert "--workers and --reducers choose otherwise; on stale weights: --stale-weights 0 chooses otherwise" in text


def test_a_machine_compared_with_cpu_workers_leaves_their_w_as_asked(capsys: pytest.CaptureFixture) -> None:
    # at the least memory a CPU worker fits a ResNet-50 sample's step beside its warm cache
    out = plan_json(capsys, *ACCEPTANCE, "--memory", "worker=3538", "--compare-vm", "1e6:1:fastbox")
    match = out["recommendation"]["as_fast_as_machine"]
    assert out["workload"]["workers"] == 4 and not match["priced"] and not match["as_fast"]
    assert out["verdict"]["recommendations"][-1].startswith(
        f"as fast as fastbox: none of W 1–8 and R 1–256 is; the fastest: --workers {match['workers']}"
    )


def run_config(params: int, sample_bytes: int, **training: object) -> RunConfig:
    """A run of a one-variable model of ``params`` weights whose sample's layer outputs take ``sample_bytes``."""
    variables = (VariableSpec(name="w", shape=(params,), trainable=True),)
    return RunConfig(
        run_id="gpu",
        dataset="images",
        training=TrainingSpec(workers=4, global_batch=8192, **training),
        optimizer=OptimizerConfig(),
        loss="mse",
        classification=False,
        plan=ShardPlan(variables=variables, bounds=(0, params)),
        sample_bytes=sample_bytes,
    )


@pytest.mark.parametrize("precision", [None, "mixed_float16"])
def test_a_gpu_workers_micro_batch_fits_its_accelerator_memory_as_the_worker_sizes_it(precision: str | None) -> None:
    """One sizing for the plan and the worker: the most samples whose step fits the accelerator's GiB, not the
    function's RAM (where a ResNet-50 sample's 148 MB of layer outputs leave room for about two)."""
    work = workload(compute_per_sample_s=0.1, global_batch=8192, training=TrainingSpec(mixed_precision=precision))
    plan = predict(on_gpu(work, gib=24))
    config = run_config(RESNET, round(work.activation_bytes_per_sample), mixed_precision=precision)
    worker = sizing.micro_batch(config, 4096, 2048, 0, accelerator_gib=24)  # a GPU function's default memory
    assert plan.micro_batch == worker == sizing.of_accelerator(config, 24).micro_batch()
    device = sizing.of_accelerator(config, 24)
    assert device.needed_bytes(worker) <= 24 * sizing.GIB < device.needed_bytes(worker + 1)
    assert worker > 50 * sizing.micro_batch(config, 4096, 2048, 0)  # the CPU worker's, from its RAM
    assert plan.micro_batches == math.ceil(8192 / 4 / worker)
    smaller = sizing.micro_batch(config, 4096, 2048, 0, accelerator_gib=6)
    assert 0 < smaller < worker
    with pytest.raises(RunFailed, match=r"GPU memory .* the worker has 3 GiB"):
        sizing.micro_batch(run_config(RESNET, 10**11), 4096, 2048, 0, accelerator_gib=3)


def test_a_gpu_worker_whose_memory_cannot_hold_the_models_buffers_beside_its_cache_is_refused() -> None:
    """The layer outputs are the GPU's; the runtime, the warm cache and the model's buffers (the step's, the
    micro-batches' sum and, handing a round on, its archive) are the function's memory's, as on a CPU worker."""
    config = run_config(40_000_000, 10**6)  # 160 MB of weights
    memory = sizing.of_run(config, 4096, 2048, 0)
    copies = sizing.MODEL_COPIES + sizing.SUM_COPIES + sizing.ARCHIVE_COPIES
    held_mb = copies * memory.model_bytes / sizing.MB
    assert sizing.TF_RUNTIME_MB + 2048 + held_mb <= 4096  # the GPU function's default memory holds them
    on_gpu = sizing.micro_batch(config, 4096, 2048, 0, accelerator_gib=24)
    assert on_gpu == sizing.of_accelerator(config, 24).micro_batch() > 1000
    assert sizing.TF_RUNTIME_MB + 1536 + held_mb > 3072  # a smaller one does not, whatever the GPU's memory
    with pytest.raises(RunFailed, match=r"the model's buffers [\d,]+ MB.* the worker has 3,072 MB: give the worker"):
        sizing.micro_batch(config, 3072, 1536, 0, accelerator_gib=24)


def test_gpu_workers_read_in_blocks_unless_the_run_needs_the_exact_order() -> None:
    cpu = workload(global_batch=8192, samples=1_281_167, sample_bytes=150_528)
    assert costmodel.workload_data(cpu, P).order == "global"
    gpu_data = costmodel.workload_data(on_gpu(cpu), P)
    assert gpu_data.order == "blocks"
    assert gpu_data.worker_gets < costmodel.workload_data(on_gpu(cpu.at(training=TrainingSpec())), P).gets_per_iteration
    drawn = TrainingSpec(validation_split=0.1, validation_samples="seeded")  # held out of the global order
    assert costmodel.workload_data(on_gpu(cpu.at(training=drawn)), P).order == "global"
    last = TrainingSpec(validation_split=0.1)  # Keras's: the last samples, the rest in blocks as ever
    assert costmodel.workload_data(on_gpu(cpu.at(training=last)), P).order == "blocks"
    one = TrainingSpec(shuffle="blocks", shuffle_block=1)  # a sample-level order on GPU workers, given
    assert costmodel.workload_data(on_gpu(cpu.at(training=one)), P).gets_per_iteration > gpu_data.gets_per_iteration
    assert TrainingSpec().on_gpu_workers().shuffle == "blocks" and TrainingSpec().shuffle == "global"


def test_a_gpu_worker_moves_s3_bytes_at_its_instances_rate_over_the_connections_it_uses() -> None:
    """Per connection as S3's guidelines give it, within the instance's network shared by its environments."""
    work = workload(compute_per_sample_s=0.1)
    whole, quarter = on_gpu(work, 24, "g5.xlarge"), on_gpu(work, 6, "g5.xlarge")
    assert gpuworker.s3_mb_s(whole, 1) == gpuworker.S3_CONNECTION_MB_S
    assert gpuworker.s3_mb_s(whole, 16) == 10e3 / 8  # 16 × 85 MB/s is past the 10 Gbps network
    assert gpuworker.s3_mb_s(quarter, 16) == 10e3 / 8 / 4  # four environments share it
    cpu_plan, gpu_plan = predict(work), predict(whole)
    cpu_update, gpu_update = (
        next(f for f in plan.functions if f.function == "worker").bytes_written for plan in (cpu_plan, gpu_plan)
    )
    assert cpu_update == gpu_update
    worker = {plan.worker.kind: next(s for s in plan.stages if s.name == "Worker") for plan in (cpu_plan, gpu_plan)}
    weights_s = P.s3_request_s + 4 * RESNET / (4 * gpuworker.S3_CONNECTION_MB_S * 1e6)  # 4 GETs at once
    assert f"read weights (4 shards) {weights_s:.2f} s" in worker["gpu"].detail
    # a multipart upload of 13 parts, sent at once: its start, the parts over 13 connections, its completion
    in_parts = 3 * P.s3_request_s + 4 * RESNET / (gpuworker.s3_mb_s(whole, 13) * 1e6)
    assert f"write update {in_parts:.2f} s" in worker["gpu"].detail
    facts = {fact.name: fact for fact in gpu_plan.worker.facts}
    assert gpuworker.S3_PERFORMANCE in facts["S3 rate"].source and gpuworker.EC2_NETWORK in facts["S3 rate"].source


def test_a_gpu_workers_streamed_reads_overlap_its_compute() -> None:
    """The samples are read two micro-batches ahead of the one computing: the Worker waits for the first only."""
    work = on_gpu(workload(compute_per_sample_s=0.1, global_batch=8192, samples=1_281_167, sample_bytes=150_528))
    plan, data = predict(work), costmodel.workload_data(work, P)
    assert data is not None and data.read_s > 0
    compute = gpuworker.KIND.compute_s(work, P, 8192 // 4)
    worker = next(s for s in plan.stages if s.name == "Worker").seconds
    apart = next(s for s in predict(work.at(samples=None)).stages if s.name == "Worker").seconds  # no data reads
    assert worker - apart < data.read_s and worker - apart <= max(0.0, data.read_s - compute) + data.read_s / 4


def test_a_deployments_limits_carry_its_accelerator_to_the_plan_budget_and_tuner() -> None:
    limits = RunLimits().with_worker_accelerator(24, ("g5.xlarge",))
    assert RunLimits.model_validate_json(limits.model_dump_json()) == limits
    work = workload(compute_per_sample_s=0.1)
    deployed = gpuworker.deployed(work, P, PRICES, limits)
    assert deployed.accelerator is not None and deployed.accelerator.instance == "g5.xlarge"
    assert gpuworker.deployed(work, P, PRICES, RunLimits()) is work
    bfloat16 = work.at(training=TrainingSpec(mixed_precision="mixed_bfloat16"))
    with pytest.raises(BadInputError, match="no mixed_bfloat16 peak is published of NVIDIA T4"):
        gpuworker.deployed(bfloat16, P, PRICES, RunLimits().with_worker_accelerator(12, ("g4dn.xlarge",)))
    # the tuner's: the time the run's workers measured, whatever the model's FLOPs, as a fraction of the L4's peak
    timed = gpuworker.measured(work, P, 0.002, limits)
    assert gpuworker.seconds_per_sample(timed, P) == pytest.approx(0.002)
    assert timed.accelerator is not None and timed.accelerator.peak_tflops == 62.5  # g5.xlarge's A10G, TF32
    config = run_config(RESNET, 148_000_000)
    on_cpu, on_gpus = tuner.predictor(config, 0.001), tuner.predictor(config, 0.001, limits)
    assert on_gpus(4) != on_cpu(4)
    ec2 = 4 * PRICES.gpu_instances["g5.xlarge"].dollars_per_hour * on_gpus(4)[0] / 3600
    assert on_gpus(4)[1] > ec2  # its instances are billed for the round, and the pipeline's requests besides


# ---- whole runs ---------------------------------------------------------------------------------------------------


def test_a_whole_run_bills_the_fleets_tail_and_whole_endpoint_hours_beside_the_plans_run() -> None:
    work = acceptance_on_gpu().at(workers=2)
    g5 = PRICES.gpu_instances["g5.xlarge"]
    for tail in (0, 300, 1800):
        p = P.model_copy(update={"gpu_scale_down_s": tail})
        plan = costmodel.predict(work, p, Quotas(), PRICES)
        seconds, dollars, extras = lambda_run(plan, p, PRICES)
        # two workers, three instances: Lambda launches three for AZ resiliency
        assert extras["scale-down tail"] == pytest.approx(3 * g5.dollars_per_hour * 1.15 * tail / 3600)
        hours = plan.run_s / 3600
        endpoint_hour = len(INTERFACE_ENDPOINTS) * ENDPOINT_AZS * PRICES.vpc_endpoint_hour
        assert extras["endpoint-hours, whole"] == pytest.approx(
            (math.ceil(hours + tail / 3600) - hours) * endpoint_hour
        )
        assert (seconds, dollars) == (plan.run_s, pytest.approx(plan.run_dollars + sum(extras.values())))


def test_the_verdict_is_per_run_and_faster_only_at_equal_gpus(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for workers in ("2", "6"):
        out = plan_json(capsys, *ACCEPTANCE, "--accelerator", "worker=24", "--workers", workers)
        vm = out["compare_vm"]
        run, machines = vm["run"], vm["machines"]
        sentence = out["verdict"]["compared"]
        assert sentence == vm["sentence"] and sentence.startswith("the run on one g6.xlarge")
        assert f"{run['lambda_seconds'] / run['seconds']:.2g}× its time" in sentence
        assert f"card busy {run['gpu_busy']:.0%}" in sentence
        assert machines["count"] == int(workers)
        faster = run["lambda_seconds"] < machines["seconds"]
        assert f"at equal GPUs, {workers} g6.xlarge" in sentence
        assert ("slsml is faster" in sentence) == faster and ("slsml is slower" in sentence) == (not faster)


RESNET50_RUN = (
    *("--params", str(cards.RESNET50_PARAMS), "--compute-per-sample", "0.4895", "--sample-bytes", "602112"),
    *("--samples", "1281167", "--batch", "8192", "--epochs", "5", "--accelerator", "worker=24"),
)


def test_the_resnet50_run_of_docs_cost_md_against_the_deployed_card(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/benchmarks.md's five epochs of ImageNet-1k on ResNet-50 (Keras's, its compute on one vCPU as measured):
    the plan chooses W and R, and stale weights, its cards waiting for the chain more than a tenth of the iteration
    otherwise; per run, at most half one g6.xlarge's time for at most 1.6× its dollars."""
    monkeypatch.chdir(tmp_path)
    synchronous = plan_json(capsys, *RESNET50_RUN, "--stale-weights", "0")
    vm, run = synchronous["compare_vm"], synchronous["compare_vm"]["run"]
    assert vm["machine"] == "g6.xlarge"
    assert run["lambda_seconds"] <= 0.5 * run["seconds"] and run["lambda_dollars"] <= 2 * run["dollars"], run
    assert 0 < run["gpu_busy"] < 1
    # the cards wait for the chain more than a tenth of the iteration: the verdict prices --stale-weights 1
    worker = next(s for s in synchronous["stages"] if s["function"] == "worker")
    assert synchronous["iteration_s"] - worker["seconds"] > 0.1 * synchronous["iteration_s"]
    advised = next(w for w in synchronous["verdict"]["warnings"] if "--stale-weights 1" in w)
    assert f"its card busy {run['gpu_busy']:.0%} of the run" in advised
    chosen = plan_json(capsys, *RESNET50_RUN)
    assert chosen["workload"]["training"]["stale_weights"] == 1  # what the plan chose, without --stale-weights
    assert not any("--stale-weights 1 (" in w for w in chosen["verdict"]["warnings"])
    stale = chosen["compare_vm"]["run"]
    assert stale == plan_json(capsys, *RESNET50_RUN, "--stale-weights", "1")["compare_vm"]["run"]
    assert stale["lambda_seconds"] < run["lambda_seconds"] and stale["lambda_dollars"] < run["lambda_dollars"]
    assert stale["gpu_busy"] > run["gpu_busy"] and f"its card busy {stale['gpu_busy']:.0%}" in advised
    assert stale["lambda_seconds"] <= 0.5 * stale["seconds"] and stale["lambda_dollars"] <= 1.6 * stale["dollars"]
    assert f"each worker's card busy {stale['gpu_busy']:.0%} of the run" in chosen["compare_vm"]["sentence"]


def test_stale_weights_overlap_the_chain_with_the_next_round_and_keep_the_card_busier() -> None:
    """``stale_weights 1`` at W = 8 on ResNet-50: a worker's invocation goes on to its next round while two rounds'
    time is left of its timeout; such a round's period is the longer of the Worker's (less its invocation's start,
    plus the model's HeadObject, the run's read and the round's take) and the reduce side (reducers, Merger, the held
    fire). A round launched as the reduce before fires takes the longer of its workers' side (launch, round, report,
    fire) and the reduce side; the one of each ``eval_every`` whose workers evaluate the merged model, the whole
    chain. The card computes a larger share of the run."""
    cpu = workload(8, 0.4895, cards.RESNET50_PARAMS, reducers=16, global_batch=8192, iterations=782, samples=1281167)
    work = on_gpu(cpu, instance="g6.xlarge")
    synchronous = predict(work)
    stale = predict(work.model_copy(update={"training": work.training.model_copy(update={"stale_weights": 1})}))
    assert synchronous.overlap_s is None and synchronous.iteration_s == synchronous.chain_s
    fires = next(i for i, s in enumerate(stale.stages) if s.function == "reduce_launcher") + 1
    workers_side = sum(s.seconds for s in stale.stages[1:fires])  # from the launch to the fire
    reduce_side = sum(s.seconds for s in stale.stages[fires:]) + stale.stages[fires - 1].seconds
    every = work.training.eval_every
    worker, gone = stale.stages[fires - 3].seconds, stale.going_on
    assert gone is not None
    stored = gone.reported_s - P.sns_lambda_s  # the update stored and WorkDone published, as the next round computes
    assert 0 < stored < worker
    period = worker - P.handler_s - stored + P.s3_request_s + 2 * P.dynamodb_s
    timeout = min(work.timeout_s["worker"], 900)
    rounds = 1 + next(n for n in itertools.count() if timeout - worker - n * period < 2 * period)
    assert (gone.rounds, gone.period_s) == (rounds, pytest.approx(period))
    launched = math.ceil(every / rounds)
    following = (every - launched) * max(period, gone.reported_s + reduce_side)
    assert stale.iteration_s == pytest.approx(
        (stale.chain_s + (launched - 1) * max(workers_side, reduce_side) + following) / every
    )
    assert stale.iteration_s < synchronous.iteration_s
    # each worker read the model its round enters while its round before computed, and kept the one before warm: no
    # weights on its path, where the synchronous round reads one model
    rounds = [next(s for s in p.stages if s.function == "worker").seconds for p in (synchronous, stale)]
    assert rounds[1] < rounds[0]
    compute = gpuworker.KIND.compute_s(work, P, 1024)
    busy = [gpu_busy(p, P) for p in (synchronous, stale)]
    assert busy == [pytest.approx(782 * compute / p.run_s) for p in (synchronous, stale)]
    assert busy[0] < busy[1] < 1
    assert compute / stale.iteration_s >= 0.9  # the card computes nine tenths of an iteration at least


def test_gpu_workers_take_no_lambda_concurrency_and_count_against_the_ec2_g_instance_quota() -> None:
    cpu_work = workload(workers=8)
    gpu_work = on_gpu(cpu_work, instance="g6.xlarge")
    cpu, gpu = predict(cpu_work), predict(gpu_work)
    quota = {q.name: q for q in gpu.quotas}
    assert {q.name: q for q in cpu.quotas}["Lambda concurrency"].value >= 8
    assert quota["Lambda concurrency"].value == gpu_work.reducers + 1  # the reducers' only
    assert "Lambda burst (first iteration)" not in quota and "EC2 G instances (vCPUs)" not in quota  # not given
    for limit, ok in ((32, True), (31, False), (0, False)):
        checks = costmodel.predict(gpu_work, P, Quotas(ec2_g_vcpus=limit), PRICES).quotas
        g = next(q for q in checks if q.name == "EC2 G instances (vCPUs)")
        assert (g.value, g.ok, g.hard) == (8 * 4, ok, True)  # 8 g6.xlarge of 4 vCPUs
    three = costmodel.predict(on_gpu(workload(workers=2), instance="g6.xlarge"), P, Quotas(ec2_g_vcpus=64), PRICES)
    assert next(q for q in three.quotas if q.name == "EC2 G instances (vCPUs)").value == 3 * 4  # three at least


def test_the_plan_takes_a_calibration_of_its_card_and_refuses_one_of_another_in_one_line(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no calibration file but those given
    argv = ("--params", "2000000", "--iterations", "3", "--workers", "2", "--accelerator", "worker=24")
    l4, a10g = tmp_path / "l4.json", tmp_path / "a10g.json"
    l4.write_text(calibration("NVIDIA L4", (24, 0.3)).model_dump_json())
    a10g.write_text(calibration("NVIDIA A10G", (24, 0.3)).model_dump_json())
    measured = plan_json(capsys, *argv, "--gpu-calibration", str(l4))
    estimated = plan_json(capsys, *argv)
    seconds = {
        name: gpuworker.seconds_per_sample(Workload.model_validate(out["workload"]), P)
        for name, out in (("measured", measured), ("estimated", estimated))
    }
    assert seconds["measured"] == pytest.approx(2_000_000 * P.train_flops_per_param_sample / (60e12 * 0.3))
    assert seconds["estimated"] == pytest.approx(seconds["measured"] * 0.3 / estimate())
    fraction = {fact["name"]: fact for fact in measured["worker"]["facts"]}["achieved fraction"]
    assert fraction["source"].startswith(f"measured on NVIDIA L4 by slsml bench gpu ({l4}")
    assert main(["plan", *argv, "--gpu-calibration", str(a10g)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "measured on NVIDIA A10G, not on the NVIDIA L4 of g6.xlarge" in err, err
    stale = tmp_path / "stale.json"  # a calibration of an earlier slsml: no FLOPs, no fractions
    stale.write_text(json.dumps({k: v for k, v in json.loads(l4.read_text()).items() if k != "train_flops_per_sample"}))
    assert main(["plan", *argv, "--gpu-calibration", str(stale)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train_flops_per_sample" in err and "slsml bench gpu" in err, err


def test_under_stale_weights_a_gpu_worker_reads_the_next_model_while_its_round_computes() -> None:
    """W = 8 on ResNet-50 under ``stale_weights 1``: the manifest of the model a round enters is stored by the reduce
    side after the fire that launched the round before, while that round's worker computes; the worker finds it
    within ``ahead.POLL_S`` and reads it: no weights on the next round's path, a HeadObject every ``POLL_S`` until
    found, and the card busy a round's compute ÷ the iteration. Where the reduce side outlasts the worker's
    invocation, the next round reads the model itself, as a synchronous round does."""
    cpu = workload(8, 0.4895, cards.RESNET50_PARAMS, reducers=16, global_batch=8192, iterations=782, samples=1281167)
    work = on_gpu(cpu, instance="g6.xlarge")
    stale = work.model_copy(update={"training": work.training.model_copy(update={"stale_weights": 1})})
    plan, synchronous = predict(stale), predict(work)
    stages = {s.name: s for s in plan.stages}
    worker, fires = stages["Worker"], [s.function for s in plan.stages].index("reduce_launcher") + 1
    started = stages["WorkLauncher"].seconds + P.sns_lambda_s + P.handler_s  # the worker's look begins, from the fire
    found = sum(s.seconds for s in plan.stages[fires:]) + ahead.POLL_S / 2  # the reducers and the Merger store it
    assert found < started + worker.seconds  # while the invocation runs
    assert "read weights (16 shards) 0.00 s" in worker.detail
    # and the rounds an invocation goes on to look once for the model they enter (one invocation's first does not)
    assert plan.going_on is not None
    gone = math.ceil(8 * (1 - 1 / plan.going_on.rounds))
    assert plan.requests_per_iteration["s3:HeadObject"] == 8 * math.ceil((found - started) / ahead.POLL_S) + gone
    # one model's GETs a round (the manifest, the shards), as a synchronous round: the one before it is warm
    assert plan.requests_per_iteration["s3:GetObject"] == synchronous.requests_per_iteration["s3:GetObject"]
    compute = gpuworker.KIND.compute_s(stale, P, 1024)
    busy = gpu_busy(plan, P, iterations=True)
    assert busy == pytest.approx(compute / plan.iteration_s)
    assert gpu_busy(synchronous, P, iterations=True) < busy < 1
    # one reducer of the whole model: the reduce side outlasts the invocation
    slow = predict(stale.at(reducers=1))
    slow_worker = next(s for s in slow.stages if s.function == "worker")
    read = next(s for s in predict(work.at(reducers=1)).stages if s.function == "worker").detail
    assert slow_worker.detail.split(" and ")[0] == read.split(" and ")[0]  # one model's read, on the path
    assert not slow_worker.detail.startswith("read weights (1 shards) 0.00 s")
