"""The plan's answer first (``Verdict``): time and dollars per epoch and run, what binds, warnings about the
configuration and what to change."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, ValidationError

from slsml.accounting import prices
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.predict import predict
from slsml.cost.recommend import MachineMatch, Recommendation, choice_of
from slsml.cost.vm import gpu_busy
from slsml.cost.workerround import handed
from slsml.cost.workload import Workload
from slsml.spec.config import TrainingSpec

FEW_SAMPLES = 16  # a worker's share of the batch below which its compute hardly pays its round trip
LATENCY_BOUND = 1 / 3  # the share of an iteration in hops between functions past which it is latency-bound
CARD_WAIT = 1 / 10  # the share of an iteration a GPU worker waits for the chain past which stale_weights is advised
SAME = 0.01  # relative differences below this are no difference


class Verdict(BaseModel):
    """The plan's answer first: time and dollars per epoch and run, what binds, warnings about the configuration
    and what to change."""

    iteration_s: float
    epoch_s: float | None
    epoch_dollars: float | None
    run_s: float
    run_dollars: float
    iterations: int
    binds: str = Field(description="the stage that takes most of an iteration, and the quota closest to its limit")
    warnings: list[str] = Field(description="what about the configuration itself wastes time or money")
    recommendations: list[str] = Field(description="changes that dominate the asked configuration, or their trade")
    compared: str | None = Field(default=None, description="against one machine (--compare-vm)")
    budget: str | None = Field(default=None, description="the run's dollars against its --budget-usd")


def verdict(
    plan: Plan, recommendation: Recommendation, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable
) -> Verdict:
    """The plan in a few sentences."""
    w = plan.workload
    stage = max(plan.stages, key=lambda s: s.seconds)
    quota = plan.binding
    binds = (
        f"{stage.name} takes {stage.seconds / plan.iteration_s:.0%} of the iteration ({stage.detail}); "
        f"nearest limit: {quota.name} at {quota.utilization:.0%}" + (f", over: {quota.detail}" if not quota.ok else "")
    )
    if plan.floor_s > plan.chain_s:
        binds = f"the iteration counter's DynamoDB writes: {plan.floor_s:.2f} s an iteration; " + binds
    warnings = []
    per_worker = math.ceil(w.global_batch / w.workers)
    worker = next(s for s in plan.stages if s.function == "worker")
    compute = w.training.local_batches * per_worker * w.compute_per_sample_s
    fewer = max(1, w.global_batch // FEW_SAMPLES)
    if per_worker < FEW_SAMPLES and fewer < w.workers:
        other = predict(w.at(workers=fewer), parameters, quotas, price_table)
        time, money = other.iteration_s / plan.iteration_s, other.iteration_dollars / plan.iteration_dollars
        warnings.append(
            f"{w.workers} workers × batch {w.global_batch:,} leave {per_worker} samples per worker: each worker's round"
            f" takes {worker.seconds:.2f} s for {compute:.2g} s of compute on one vCPU; {fewer} workers would take"
            f" {time:.2g}× the time for {money:.2g}× the dollars"
        )
    hops = sum(s.seconds for s in plan.stages if s.function is None)
    if hops >= LATENCY_BOUND * plan.iteration_s:
        warnings.append(
            f"latency-bound: {hops / plan.iteration_s:.0%} of the iteration ({hops:.2f} of "
            f"{plan.iteration_s:.2f} s) is SNS delivery between functions, whatever the"
            " workers compute; more work per round (a larger batch, --local-steps) spreads it"
        )
    if handing := continuation_sentence(plan):
        warnings.append(handing)
    if waiting := card_wait_sentence(plan, parameters, quotas, price_table):
        warnings.append(waiting)
    warnings += [f"over {q.name}: {q.detail}" for q in plan.violations if q.name != quota.name or quota.ok]
    budget = w.training.budget_usd
    if budget is not None:
        over = plan.run_dollars > budget
        budget_sentence = (
            f"{prices.usd(plan.run_dollars)} for the run is {'above' if over else 'within'} its"
            f" budget of {prices.usd(budget)}" + (": run start refuses it" if over else "")
        )
    return Verdict(
        iteration_s=plan.iteration_s,
        epoch_s=plan.epoch_s,
        epoch_dollars=plan.epoch_dollars,
        run_s=plan.run_s,
        run_dollars=plan.run_dollars,
        iterations=w.iterations,
        binds=binds,
        warnings=warnings,
        recommendations=advice(plan, recommendation),
        budget=None if budget is None else budget_sentence,
    )


def on_stale_weights(plan: Plan) -> Workload | None:
    """The plan's workload on ``stale_weights 1`` where its GPU workers wait for the chain more than ``CARD_WAIT`` of
    the iteration and its update rule takes stale weights (None: CPU workers, stale weights asked, little wait)."""
    w = plan.workload
    waited = plan.iteration_s - next(s for s in plan.stages if s.function == "worker").seconds
    if w.accelerator is None or w.training.stale_weights or waited <= CARD_WAIT * plan.iteration_s:
        return None
    try:
        training = TrainingSpec.model_validate({**w.training.model_dump(exclude_unset=True), "stale_weights": 1})
    except ValidationError:  # e.g. a local update rule, or staleness unbounded
        return None
    return w.model_copy(update={"training": training})


def card_wait_sentence(
    plan: Plan, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable
) -> str | None:
    """GPU workers whose cards wait for the chain (the reducers, the Merger, the hops) more than ``CARD_WAIT`` of the
    iteration: what ``--stale-weights 1`` makes of it (None: CPU workers, stale weights asked, or little wait)."""
    stale = on_stale_weights(plan)
    if stale is None:
        return None
    waited = plan.iteration_s - next(s for s in plan.stages if s.function == "worker").seconds
    other = predict(stale, parameters, quotas, price_table)
    busy, other_busy = gpu_busy(plan, parameters), gpu_busy(other, parameters)
    assert busy is not None and other_busy is not None  # GPU workers
    return (
        f"each GPU worker waits {waited:.2f} s of the {plan.iteration_s:.2f} s iteration for the reducers and the"
        f" Merger (its card busy {busy:.0%} of the run); --stale-weights 1 (each round's workers launched as the"
        f" round before's reduce fires, on weights one round stale): {other.run_s / plan.run_s:.3g}× the time for"
        f" {other.run_dollars / plan.run_dollars:.3g}× the dollars, its card busy {other_busy:.0%}"
    )


def continuation_sentence(plan: Plan) -> str | None:
    """What handing each round on to fresh invocations adds (None: every round fits one Worker invocation)."""
    handing, w = plan.continuations, plan.workload
    if not handing.handed_on:
        return None
    requests = sum(call.count for call in handing.calls)
    sentence = (
        f"each worker's round outlasts the Worker's {handing.timeout_s:g} s timeout: it goes on in"
        f" {handing.invocations} invocations of {handed(handing, plan.micro_batch, plan.micro_batches)}, each handing"
        f" on {handing.progress_bytes / 1e6:,.1f} MB of progress; that adds {requests:,} requests,"
        f" {(handing.bytes_read + handing.bytes_written) / 1e6:,.1f} MB and {handing.seconds:,.2f} s an iteration"
    )
    heartbeat = w.training.heartbeat_s
    if plan.iteration_s > heartbeat:
        sentence += f"; raise --heartbeat above {math.ceil(plan.iteration_s)} s (it is {heartbeat} s)"
    return sentence


def advice(plan: Plan, recommendation: Recommendation) -> list[str]:
    """Each recommended choice against the asked one: what dominates, what trades time for dollars, or that the
    asked one is already the best of its kind."""
    w, asked = plan.workload, choice_of(plan)
    advice = []
    seen: set[tuple[int, int, int]] = set()
    for label, choice in (("fastest", recommendation.fastest), ("cheapest", recommendation.cheapest)):
        if choice is None:
            advice.append(f"{label}: nothing at W = {w.workers} fits Lambda's limits; see the quotas")
            continue
        key = (choice.reducers, choice.worker_memory_mb, choice.reducer_memory_mb)
        if key in seen:
            continue
        seen.add(key)
        change = ", ".join(
            flag
            for flag, differs in (
                (f"--reducers {choice.reducers}", choice.reducers != asked.reducers),
                (f"--memory worker={choice.worker_memory_mb}", choice.worker_memory_mb != asked.worker_memory_mb),
                (f"--memory reducer={choice.reducer_memory_mb}", choice.reducer_memory_mb != asked.reducer_memory_mb),
            )
            if differs
        )
        time = choice.iteration_s / asked.iteration_s
        money = choice.iteration_dollars / asked.iteration_dollars
        if not change or (time >= 1 - SAME and money >= 1 - SAME):
            advice.append(f"{label}: the asked configuration already is")
        elif time <= 1 + SAME and money <= 1 + SAME:
            advice.append(
                f"{label}: {change}: {_times(time, 'the time')} and {_times(money, 'the dollars')}, better on both"
            )
        elif time < 1:
            advice.append(f"{label}: {change}: {1 / time:.3g}× faster for {money:.3g}× the dollars")
        else:
            advice.append(f"{label}: {change}: {1 / money:.3g}× cheaper for {time:.3g}× the time")
    if recommendation.as_fast_as_machine is not None:
        advice.append(match_sentence(recommendation.as_fast_as_machine, plan))
    return advice


def match_sentence(match: MachineMatch, plan: Plan) -> str:
    """The cheapest W and R as fast as the machine (or that none is, and the fastest), against the machine."""
    w = plan.workload
    flags = f"--workers {match.workers} --reducers {match.reducers}" + (
        f" --stale-weights {match.stale_weights}" if match.stale_weights else ""
    )
    if (match.workers, match.reducers) == (w.workers, w.reducers):
        flags += " (the plan's)"
    figures = f"{match.time_vs_machine:.3g}× its time for {match.dollars_vs_machine:.3g}× its dollars"
    if match.as_fast:
        return f"as fast as {match.machine} for least: {flags}: {figures}"
    return f"as fast as {match.machine}: none of {match.searched} is; the fastest: {flags}: {figures}"


def _times(ratio: float, what: str) -> str:
    """``ratio`` of ``what`` in words, or unchanged where it is within ``SAME``."""
    return f"{what} unchanged" if abs(ratio - 1) <= SAME else f"{ratio:.3g}× {what}"
