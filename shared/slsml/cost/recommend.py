"""The plan's choices: the fastest and the cheapest reducers and memory for a workload, the cheapest W and R as fast
as one machine, the quotas W reaches as it grows, and the sweep of an epoch's time and dollars against W."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from functools import cache

from pydantic import BaseModel, Field

from slsml.accounting import prices
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.predict import predict
from slsml.cost.vm import VmComparison, lambda_run
from slsml.cost.workers import kind_of
from slsml.cost.workload import MEMORY_CHOICES_MB, Workload, with_memory
from slsml.spec.errors import BadInputError

REDUCER_CHOICES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
SWEEP_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
MATCH_WORKERS = 8  # the match with a machine searches W up to this, or up to the asked W where it is more


class Choice(BaseModel):
    """One configuration of the workload's W: its reducers and memory, and what an iteration takes."""

    reducers: int
    worker_memory_mb: int
    reducer_memory_mb: int
    iteration_s: float
    iteration_dollars: float
    epoch_dollars: float | None


class MachineMatch(BaseModel):
    """Against one machine: the cheapest W and R whose whole run is no slower than the machine's, or where none is,
    the fastest W and R; at the workload's memory."""

    machine: str
    as_fast: bool = Field(description="whether this W and R is no slower than the machine (else none searched is)")
    workers: int
    reducers: int
    seconds: float = Field(description="the whole run's time at this W and R (``vm.lambda_run``)")
    dollars: float
    time_vs_machine: float
    dollars_vs_machine: float
    searched: str = Field(description="the W and R searched, in words")
    priced: bool = Field(default=False, description="whether the plan is priced at this W and R (no --workers)")
    stale_weights: int = Field(
        default=0, description="the run's stale_weights: 1 where the plan chose it (no --workers or --stale-weights)"
    )


class Recommendation(BaseModel):
    """The fastest and the cheapest choices at the workload's W, and against a machine the cheapest W and R as
    fast as it."""

    fastest: Choice | None = Field(description="least time per iteration; None: nothing fits Lambda's limits")
    cheapest: Choice | None = Field(description="fewest dollars per iteration")
    over: list[str] = Field(description="throughput quotas the fastest choice still exceeds (none fits them all)")
    as_workers_grow: str = Field(description="the quotas W reaches as it grows, R and the batch fixed")
    as_fast_as_machine: MachineMatch | None = Field(
        default=None, description="with a machine compared: None where no W and R searched fits Lambda's limits"
    )


def choice_of(plan: Plan) -> Choice:
    """The plan's configuration as a choice."""
    w = plan.workload
    return Choice(
        reducers=w.reducers,
        worker_memory_mb=w.memory_mb["worker"],
        reducer_memory_mb=w.memory_mb["reducer"],
        iteration_s=plan.iteration_s,
        iteration_dollars=plan.iteration_dollars,
        epoch_dollars=plan.epoch_dollars,
    )


def rank(plan: Plan, objective: float) -> tuple[int, int, float]:
    """Within Lambda's hard limits first, then within the throughput quotas, then by the objective."""
    return (sum(q.hard for q in plan.violations), sum(not q.hard for q in plan.violations), objective)


def _faster(plan: Plan) -> tuple[int, int, float]:
    return rank(plan, plan.iteration_s + 1e-9 * plan.iteration_dollars)


def _cheaper(plan: Plan) -> tuple[int, int, float]:
    return rank(plan, plan.iteration_dollars + 1e-9 * plan.iteration_s)


def recommend(
    workload: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: prices.PriceTable,
    reducers_fixed: bool = False,
) -> Recommendation:
    """The fastest and the cheapest R and worker and reducer memory for the workload's W and model (the worker's
    memory among those its kind chooses from)."""
    reducers = (
        [workload.reducers]
        if reducers_fixed
        else sorted({r for r in (*REDUCER_CHOICES, workload.reducers) if r <= min(256, workload.params)})
    )
    fastest: Plan | None = None  # kept as they come: the two best plans are held, not the thousands weighed
    cheapest: Plan | None = None
    memories = kind_of(workload).memory_choices(workload)
    for r, wm, rm in itertools.product(reducers, memories, MEMORY_CHOICES_MB):
        plan = predict(with_memory(workload, worker=wm, reducer=rm).at(reducers=r), parameters, quotas, price_table)
        if fastest is None or _faster(plan) < _faster(fastest):
            fastest = plan
        if cheapest is None or _cheaper(plan) < _cheaper(cheapest):
            cheapest = plan
    assert fastest is not None and cheapest is not None  # (every kind has a memory to choose)

    def fits(plan: Plan) -> Choice | None:
        return None if any(q.hard for q in plan.violations) else choice_of(plan)

    return Recommendation(
        fastest=fits(fastest),
        cheapest=fits(cheapest),
        over=[q.name for q in fastest.violations],
        as_workers_grow=as_workers_grow(workload, parameters, quotas, price_table),
    )


def fastest_reducers(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> int:
    """The R of least iteration time for the workload's W and memory."""
    plans = [
        predict(workload.at(reducers=r), parameters, quotas, price_table)
        for r in REDUCER_CHOICES
        if r <= workload.params
    ]
    return min(plans, key=lambda plan: rank(plan, plan.iteration_s)).workload.reducers


def match_workers(workload: Workload, quotas: Quotas) -> list[int]:
    """The W the match with a machine searches: 1 to the larger of ``MATCH_WORKERS`` and the workload's W (within
    the batch and the concurrency), each W up to 10, then steps of about a tenth, and the workload's W."""
    top = min(max(workload.workers, MATCH_WORKERS), workload.global_batch, quotas.lambda_concurrency)
    counts, count = {top, min(top, workload.workers)}, 1.0
    while count < top:
        counts.add(round(count))
        count = max(count * 1.1, count + 1)
    return sorted(counts)


def as_fast_as(
    workload: Workload,
    vm: VmComparison,
    parameters: Parameters,
    quotas: Quotas,
    price_table: prices.PriceTable,
    reducers_fixed: bool = False,
) -> MachineMatch | None:
    """The cheapest W (``match_workers``) and R (the workload's if ``reducers_fixed``, else of ``REDUCER_CHOICES``)
    whose whole run is no slower than ``vm``'s machine's, within the throughput quotas first; where none is, the
    fastest. None: no W and R fits Lambda's limits."""
    reducers = [workload.reducers] if reducers_fixed else [r for r in REDUCER_CHOICES if r <= workload.params]
    workers = match_workers(workload, quotas)
    priced = (
        predict(workload.at(workers=count, reducers=r), parameters, quotas, price_table)
        for count in workers
        for r in reducers
    )
    # each plan within Lambda's limits with its whole run's seconds and dollars, as the machine's run is compared
    figures = [
        (plan, *lambda_run(plan, parameters, price_table)[:2])
        for plan in priced
        if not any(q.hard for q in plan.violations)
    ]
    if not figures:
        return None
    as_fast = [entry for entry in figures if entry[1] <= vm.run.seconds]
    if as_fast:
        best, seconds, dollars = min(as_fast, key=lambda entry: rank(entry[0], entry[2] + 1e-9 * entry[1]))
    else:
        best, seconds, dollars = min(figures, key=lambda entry: rank(entry[0], entry[1] + 1e-9 * entry[2]))
    spans = f"W {workers[0]}–{workers[-1]}" if len(workers) > 1 else f"W {workers[0]}"
    return MachineMatch(
        machine=vm.machine,
        as_fast=bool(as_fast),
        workers=best.workload.workers,
        reducers=best.workload.reducers,
        seconds=seconds,
        dollars=dollars,
        time_vs_machine=seconds / vm.run.seconds,
        dollars_vs_machine=dollars / vm.run.dollars,
        searched=f"{spans} at R {reducers[0]}" if reducers_fixed else f"{spans} and R {reducers[0]}–{reducers[-1]}",
        stale_weights=workload.training.stale_weights,
    )


def quota_changes(
    workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable, top: int | None = None
) -> list[tuple[int, str, bool]]:
    """(W, quota, exceeded from this W on) for each quota that changes side as W grows from 1 to ``top``,
    R, batch and memory fixed."""
    top = top or min(quotas.lambda_concurrency, workload.global_batch)

    @cache
    def broken(workers: int) -> frozenset[str]:
        plan = predict(workload.at(workers=workers), parameters, quotas, price_table)
        return frozenset(q.name for q in plan.violations)

    changes = []
    previous = 1
    grid = sorted({min(top, max(1, round(1.05**i))) for i in range(400)} | {top})
    for workers in grid[1:]:
        for name in sorted(broken(previous) ^ broken(workers)):
            low, high = previous, workers  # bisect to the first W on the new side
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (low, middle) if (name in broken(middle)) != (name in broken(previous)) else (middle, high)
            changes.append((high, name, name in broken(workers)))
        previous = workers
    return sorted(changes)


def as_workers_grow(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> str:
    """The quotas' changes as W grows, in words."""
    top = min(quotas.lambda_concurrency, workload.global_batch)
    head = f"as W grows from 1 to {top} (R = {workload.reducers}, batch {workload.global_batch})"
    initially = sorted(q.name for q in predict(workload.at(workers=1), parameters, quotas, price_table).violations)
    parts = [f"over at W = 1: {', '.join(initially)}"] if initially else []
    for workers, name, exceeded in quota_changes(workload, parameters, quotas, price_table, top):
        parts.append(f"{name} {'exceeded' if exceeded else 'fits'} from W = {workers}")
    return f"{head}: " + ("; ".join(parts) if parts else "no quota is reached")


class SweepPoint(BaseModel):
    """One W of a sweep: its reducers, a worker's step, and an epoch's time and dollars."""

    workers: int
    reducers: int
    micro_batch: int = Field(description="the most samples a worker computes at once (the plan's)")
    micro_batches: int = Field(description="micro-batches of a worker's step")
    invocations: int = Field(description="Worker invocations a round takes (more than 1: handed on)")
    iteration_s: float
    epoch_s: float
    epoch_dollars: float
    violations: list[str]


def sweep(
    workload: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: prices.PriceTable,
    reducers_fixed: bool,
    workers: Iterable[int] = SWEEP_WORKERS,
) -> list[SweepPoint]:
    """Time and dollars per epoch against W (batch, memory fixed; R fixed or the fastest at each W), each W as it
    would run: its workers' shares in micro-batches that fit, its rounds handed on where they outlast the timeout."""
    if workload.iterations_per_epoch is None:
        raise BadInputError("a sweep prices epochs: give --epochs and --samples")
    points = []
    for count in workers:
        if count > min(workload.global_batch, quotas.lambda_concurrency):
            continue
        at = workload.at(workers=count)
        if not reducers_fixed:
            at = at.at(reducers=fastest_reducers(at, parameters, quotas, price_table))
        plan = predict(at, parameters, quotas, price_table)
        points.append(
            SweepPoint(
                workers=count,
                reducers=at.reducers,
                micro_batch=plan.micro_batch,
                micro_batches=plan.micro_batches,
                invocations=plan.continuations.invocations,
                iteration_s=plan.iteration_s,
                epoch_s=plan.epoch_s,
                epoch_dollars=plan.epoch_dollars,
                violations=[q.name for q in plan.violations],
            )
        )
    return points
