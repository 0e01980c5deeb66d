"""The same samples trained on one machine, at its throughput and hourly price (``--compare-vm``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from slsml.cost.plan import Plan


class VmComparison(BaseModel):
    """The same samples trained on one machine, at its throughput and hourly price (``--compare-vm``)."""

    machine: str
    samples_per_s: float = Field(gt=0, description="training throughput of the machine on this model")
    dollars_per_hour: float = Field(gt=0, description="its on-demand price")
    source: str = Field(description="where the two figures come from")
    samples: int = Field(description="what is compared: an epoch's samples, else the run's")
    seconds: float
    dollars: float
    lambda_seconds: float
    lambda_dollars: float
    sentence: str


def compared(plan: Plan) -> tuple[str, int, float, float]:
    """What of the plan a machine is compared on: (an epoch, else the run; its samples, seconds and dollars)."""
    w = plan.workload
    if plan.epoch_s is not None and plan.epoch_dollars is not None and w.samples is not None:
        return "an epoch", w.samples, plan.epoch_s, plan.epoch_dollars
    return "the run", w.iterations * w.global_batch, plan.run_s, plan.run_dollars


def compare_vm(
    plan: Plan, machine: str, samples_per_s: float, dollars_per_hour: float, source: str = "given (--compare-vm)"
) -> VmComparison:
    """The plan's epoch (or run, without --samples) against one machine of ``samples_per_s`` and
    ``dollars_per_hour``: billed by the second for the time the samples take."""
    what, samples, lambda_s, lambda_dollars = compared(plan)
    seconds = samples / samples_per_s
    dollars = seconds / 3600 * dollars_per_hour
    time, money = lambda_s / seconds, lambda_dollars / dollars
    sentence = (
        f"{what} on {machine} ({samples_per_s:,.4g} samples/s, ${dollars_per_hour:,.4g}/h; {source}): "
        f"{seconds:,.0f} s and ${dollars:,.4g}; slsml takes {time:.2g}× its time for {money:.2g}× its dollars"
    )
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
        sentence=sentence,
    )


class Side(BaseModel):
    """One way to train the run's samples, beside the others (``side_by_side``): an epoch's and the run's time and
    dollars, and against the machine's."""

    what: str
    epoch_s: float | None = Field(description="None without --samples")
    epoch_dollars: float | None
    run_s: float = Field(description="the run, its first iteration (cold starts, a GPU fleet's scale-up) included")
    run_dollars: float
    time_vs_machine: float = Field(description="the epoch's (else the run's) time over the machine's")
    dollars_vs_machine: float
    source: str


def side_by_side(plans: list[tuple[str, Plan]], vm: VmComparison) -> list[Side]:
    """Each of ``plans`` (named), then the machine of ``vm``, on the same samples: the machine trains an epoch's
    (and the run's) samples at its throughput, billed by the second."""
    w = plans[0][1].workload
    run_s = w.iterations * w.global_batch / vm.samples_per_s
    epoch_s = None if w.samples is None else w.samples / vm.samples_per_s
    machine_s = run_s if epoch_s is None else epoch_s

    def dollars(seconds: float) -> float:
        return seconds / 3600 * vm.dollars_per_hour

    sides = [
        Side(
            what=name,
            epoch_s=plan.epoch_s,
            epoch_dollars=plan.epoch_dollars,
            run_s=plan.run_s,
            run_dollars=plan.run_dollars,
            time_vs_machine=(plan.run_s if plan.epoch_s is None else plan.epoch_s) / machine_s,
            dollars_vs_machine=(plan.run_dollars if plan.epoch_dollars is None else plan.epoch_dollars)
            / dollars(machine_s),
            source=f"slsml plan: {plan.worker.billing}",
        )
        for name, plan in plans
    ]
    sides.append(
        Side(
            what=f"one {vm.machine} ({vm.samples_per_s:,.4g} samples/s, ${vm.dollars_per_hour:g}/h)",
            epoch_s=epoch_s,
            epoch_dollars=None if epoch_s is None else dollars(epoch_s),
            run_s=run_s,
            run_dollars=dollars(run_s),
            time_vs_machine=1.0,
            dollars_vs_machine=1.0,
            source=vm.source,
        )
    )
    return sides
