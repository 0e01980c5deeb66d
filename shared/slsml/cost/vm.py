"""The same samples trained on one machine, and on W machines data-parallel, at its throughput and hourly price
(``--compare-vm``): per epoch, and per whole run.

A whole run, slsml's: the plan's run (the fleet's scale-up before the first iteration, every iteration's functions,
requests, reducers and S3), and for GPU workers what else Lambda Managed Instances bill (``gpuworker.run_extras``:
the scale-down tail, whole endpoint-hours). A machine's: its start-up (``vm_start_s``), the time its data takes to
reach it past what its compute hides (streamed from S3 at its network rate), then its samples at its throughput,
billed by the second. W machines train data-parallel: each its share of every batch, then a ring all-reduce of the
gradients (2 (W − 1) / W of the model's float32 bytes each way) at the instance's network bandwidth; billed W times."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from slsml.accounting.prices import PriceTable
from slsml.cost.gpuworker import EC2_NETWORK, KIND, NETWORK_GBPS, S3_CONNECTION_MB_S, S3_PERFORMANCE, run_extras
from slsml.cost.parameters import Parameters
from slsml.cost.plan import Plan
from slsml.spec.deployment import GPU_INSTANCES


class RunFigures(BaseModel):
    """The whole run on slsml and on one machine: time and dollars."""

    seconds: float = Field(description="the machine's: its start-up, its data's arrival past its compute, its samples")
    dollars: float
    lambda_seconds: float = Field(description="slsml's: the plan's run, the fleet's scale-up included")
    lambda_dollars: float = Field(
        description="the plan's run and, for GPU workers, the scale-down tail and whole endpoint-hours"
    )
    lambda_extras: dict[str, float] = Field(description="what the run adds to the plan's iterations, in dollars")
    machine_start_s: float
    machine_data_s: float = Field(description="the machine's wait for its data, past what its compute hides")
    gpu_busy: float | None = Field(description="the share of the run a GPU worker's card computes; None: CPU workers")
    gpu_busy_iterations: float | None = Field(
        description="the share of an iteration a GPU worker's card computes (the run less its scale-up); None: CPU"
        " workers"
    )


class Machines(BaseModel):
    """W machines of the same type training the run data-parallel: as many GPUs as slsml's W workers."""

    count: int
    allreduce_s: float = Field(description="a ring all-reduce of the gradients per iteration, at the network rate")
    network_gbps: float
    epoch_s: float | None
    epoch_dollars: float | None
    seconds: float = Field(description="the whole run: start-up, data, iterations")
    dollars: float
    source: str


class VmComparison(BaseModel):
    """The same samples trained on one machine, at its throughput and hourly price (``--compare-vm``), per epoch and
    per run, and on W machines of it."""

    machine: str
    samples_per_s: float = Field(gt=0, description="training throughput of the machine on this model")
    dollars_per_hour: float = Field(gt=0, description="its on-demand price")
    source: str = Field(description="where the two figures come from")
    samples: int = Field(description="what is compared: an epoch's samples, else the run's")
    seconds: float
    dollars: float
    lambda_seconds: float
    lambda_dollars: float
    run: RunFigures = Field(description="the whole run, slsml's and the machine's")
    machines: Machines | None = Field(
        description="as many machines as slsml's workers take GPUs, data-parallel (None: not the workers' type)"
    )
    sentence: str


def compared(plan: Plan) -> tuple[str, int, float, float]:
    """What of the plan a machine is compared on: (an epoch, else the run; its samples, seconds and dollars)."""
    w = plan.workload
    if plan.epoch_s is not None and plan.epoch_dollars is not None and w.samples is not None:
        return "an epoch", w.samples, plan.epoch_s, plan.epoch_dollars
    return "the run", w.iterations * w.global_batch, plan.run_s, plan.run_dollars


def lambda_run(plan: Plan, p: Parameters, price_table: PriceTable) -> tuple[float, float, dict[str, float]]:
    """slsml's whole run: (seconds, dollars, what it adds to the plan's iterations and first iteration)."""
    extras = run_extras(plan.workload, p, price_table, plan.run_s) if plan.workload.accelerator is not None else {}
    return plan.run_s, plan.run_dollars + sum(extras.values()), extras


def gpu_busy(plan: Plan, p: Parameters, iterations: bool = False) -> float | None:
    """The share of the run (``iterations``: of an iteration) a GPU worker's card computes its share of the batches,
    of the time its instance is billed for; None: CPU workers."""
    w = plan.workload
    if w.accelerator is None:
        return None
    per_iteration = KIND.compute_s(w, p, w.training.local_batches * math.ceil(w.global_batch / w.workers))
    return per_iteration / plan.iteration_s if iterations else w.iterations * per_iteration / plan.run_s


def _network_mb_s(machine: str, p: Parameters) -> float:
    """MB/s a machine reads S3 at: ``s3_parallel_reads`` connections within its network (a GPU type's; else the
    connections alone)."""
    connections = p.s3_parallel_reads * S3_CONNECTION_MB_S
    return min(connections, NETWORK_GBPS[machine] * 1e3 / 8) if machine in NETWORK_GBPS else connections


def _data_s(bytes_needed: float, compute_s: float, first_bytes: float, mb_s: float) -> float:
    """The wait for data streamed at ``mb_s`` beside ``compute_s`` of compute: its first batch, and whatever of the
    transfer the compute does not hide."""
    return first_bytes / (mb_s * 1e6) + max(0.0, bytes_needed / (mb_s * 1e6) - compute_s)


def compare_vm(
    plan: Plan,
    machine: str,
    samples_per_s: float,
    dollars_per_hour: float,
    source: str,
    p: Parameters,
    price_table: PriceTable,
) -> VmComparison:
    """The plan's epoch (or run, without --samples) and whole run against one machine of ``samples_per_s`` and
    ``dollars_per_hour``, and against W of them data-parallel."""
    w = plan.workload
    what, samples, lambda_s, lambda_dollars = compared(plan)
    seconds = samples / samples_per_s
    dollars = seconds / 3600 * dollars_per_hour
    run_samples = w.iterations * w.global_batch
    compute_s = run_samples / samples_per_s
    mb_s = _network_mb_s(machine, p)
    sample_bytes = w.sample_bytes or 0  # unknown: no data to wait for
    data_s = _data_s(run_samples * sample_bytes, compute_s, w.global_batch * sample_bytes, mb_s)
    machine_s = p.vm_start_s + data_s + compute_s
    run_s, run_dollars, extras = lambda_run(plan, p, price_table)
    run = RunFigures(
        seconds=machine_s,
        dollars=machine_s / 3600 * dollars_per_hour,
        lambda_seconds=run_s,
        lambda_dollars=run_dollars,
        lambda_extras=extras,
        machine_start_s=p.vm_start_s,
        machine_data_s=data_s,
        gpu_busy=gpu_busy(plan, p),
        gpu_busy_iterations=gpu_busy(plan, p, iterations=True),
    )
    machines = _machines(plan, machine, samples_per_s, dollars_per_hour, p, mb_s)
    sentence = (
        f"the run on one {machine} ({samples_per_s:,.4g} samples/s, ${dollars_per_hour:,.4g}/h; {source}):"
        f" {run.seconds:,.0f} s and ${run.dollars:,.4g} ({p.vm_start_s:g} s start-up, {data_s:,.0f} s waiting for"
        f" data); slsml's {w.workers} workers take {run_s:,.0f} s and ${run_dollars:,.4g}, {run_s / run.seconds:.2g}×"
        f" its time for {run_dollars / run.dollars:.2g}× its dollars"
    )
    if run.gpu_busy is not None:
        sentence += f", each worker's card busy {run.gpu_busy:.0%} of the run ({run.gpu_busy_iterations:.0%} of an"
        sentence += " iteration)"
    if machines is not None and machines.count > 1:
        faster = "faster" if run_s < machines.seconds else "slower"
        sentence += (
            f"; at equal GPUs, {machines.count} {machine} training data-parallel take {machines.seconds:,.0f} s and"
            f" ${machines.dollars:,.4g}: slsml is {faster} ({run_s / machines.seconds:.2g}× their time for"
            f" {run_dollars / machines.dollars:.2g}× their dollars)"
        )
    sentence += f" (an epoch: {lambda_s / seconds:.2g}× the one machine's time for {lambda_dollars / dollars:.2g}×)"
    return VmComparison(
        machine=machine,
        samples_per_s=samples_per_s,
        dollars_per_hour=dollars_per_hour,
        source=source,
        samples=samples,
        seconds=seconds,
        dollars=dollars,
        lambda_seconds=lambda_s,
        lambda_dollars=lambda_dollars,
        run=run,
        machines=machines,
        sentence=sentence if what == "an epoch" else sentence.rsplit(" (an epoch:", 1)[0],
    )


def _machines(
    plan: Plan, machine: str, samples_per_s: float, dollars_per_hour: float, p: Parameters, mb_s: float
) -> Machines | None:
    """As many machines as the plan's GPU workers take GPUs, training the run data-parallel; None where the machine
    is not of the workers' instance type (or they are CPU workers)."""
    w, a = plan.workload, plan.workload.accelerator
    if a is None or machine != a.instance:
        return None
    kind = GPU_INSTANCES[machine]
    count, gbps = math.ceil(w.workers * a.gib / kind.gpu_memory_gib / kind.gpus), NETWORK_GBPS[machine]
    allreduce = 2 * (count - 1) / count * 4 * w.params / (gbps * 1e9 / 8)
    iteration = math.ceil(w.global_batch / count) / samples_per_s + allreduce
    batch_bytes = math.ceil(w.global_batch / count) * (w.sample_bytes or 0)
    data_s = _data_s(w.iterations * batch_bytes, w.iterations * iteration, batch_bytes, mb_s)
    seconds = p.vm_start_s + data_s + w.iterations * iteration
    epoch_s = None if w.iterations_per_epoch is None else w.iterations_per_epoch * iteration
    return Machines(
        count=count,
        allreduce_s=allreduce,
        network_gbps=gbps,
        epoch_s=epoch_s,
        epoch_dollars=None if epoch_s is None else count * epoch_s / 3600 * dollars_per_hour,
        seconds=seconds,
        dollars=count * seconds / 3600 * dollars_per_hour,
        source=f"a ring all-reduce of {4 * w.params / 1e6:,.0f} MB of float32 gradients at {gbps:g} Gbps"
        f" ({EC2_NETWORK}), not overlapped with compute; data from S3 ({S3_PERFORMANCE})",
    )


class Side(BaseModel):
    """One way to train the run's samples, beside the others (``side_by_side``): an epoch's and the whole run's time
    and dollars, and the run's against one machine's."""

    what: str
    epoch_s: float | None = Field(description="None without --samples")
    epoch_dollars: float | None
    run_s: float = Field(description="the whole run: slsml's scale-up and tail, a machine's start-up and data")
    run_dollars: float
    time_vs_machine: float = Field(description="the run's time over one machine's")
    dollars_vs_machine: float
    source: str


def side_by_side(plans: list[tuple[str, Plan]], vm: VmComparison, p: Parameters, price_table: PriceTable) -> list[Side]:
    """Each of ``plans`` (named), then one machine of ``vm`` and W of it data-parallel, on the same samples."""
    w = plans[0][1].workload
    epoch_s = None if w.samples is None else w.samples / vm.samples_per_s

    def side(what: str, epoch: float | None, epoch_dollars: float | None, run_s: float, dollars: float, source: str):
        return Side(
            what=what,
            epoch_s=epoch,
            epoch_dollars=epoch_dollars,
            run_s=run_s,
            run_dollars=dollars,
            time_vs_machine=run_s / vm.run.seconds,
            dollars_vs_machine=dollars / vm.run.dollars,
            source=source,
        )

    sides = []
    for name, plan in plans:
        run_s, run_dollars, _ = lambda_run(plan, p, price_table)
        sides.append(
            side(name, plan.epoch_s, plan.epoch_dollars, run_s, run_dollars, f"slsml plan: {plan.worker.billing}")
        )
    sides.append(
        side(
            f"one {vm.machine} ({vm.samples_per_s:,.4g} samples/s, ${vm.dollars_per_hour:g}/h)",
            epoch_s,
            None if epoch_s is None else epoch_s / 3600 * vm.dollars_per_hour,
            vm.run.seconds,
            vm.run.dollars,
            vm.source,
        )
    )
    if vm.machines is not None and vm.machines.count > 1:
        m = vm.machines
        sides.append(
            side(f"{m.count} × {vm.machine}, data-parallel", m.epoch_s, m.epoch_dollars, m.seconds, m.dollars, m.source)
        )
    return sides
