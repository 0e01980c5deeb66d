"""The worker-count tuner of ``--workers auto``: before each round is launched, it looks at how long the
rounds before took at each worker count it tried, and moves the workers at most one step along a ladder
(1, 2, 3, 4, 6, 8, 12, …) toward the count that minimizes the objective: seconds per round (``time``; the
global batch does not depend on the workers, so the rounds to an accuracy do not either) or dollars
per round (``cost``).

Seconds come from measurement where there is one (the median of the last rounds at that count, the first
round after a change left out: it starts containers). A count not tried yet is predicted: the analytic
cost model's ratio of its seconds to the current count's, times what the current count measured. Dollars
come from the cost model with the worker compute measured. A move needs the objective to improve by
``MARGIN`` and ``DWELL`` measured rounds at the current count, so noise does not make it oscillate.

The cost model knows AWS, where a round's control plane hardly grows with the workers; elsewhere (the
embedded cloud serves requests one by one) it may not hold. So with objective ``time``, a neighbour not
tried that the model does not predict clearly slower (within ``MARGIN``) is tried once: from then on its
measurement decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from pydantic import BaseModel, Field

from slsml.spec.config import Objective, RunConfig
from slsml.spec.limits import RunLimits
from slsml.state.records import Measurement, TunerState

MARGIN = 0.05  # a move must promise at least this much less of the objective
DWELL = 2  # measured rounds at a count before moving on from it
KEEP = 5  # measurements kept per count
LADDER = sorted({m * 2**k for m in (1, 3) for k in range(11)} | {1000})


class Decision(BaseModel):
    workers: int
    reason: str | None = Field(description="why the workers change; None: they stay")
    state: TunerState


Predict = Callable[[int], tuple[float, float]]  # workers → (seconds, dollars) per round, by the cost model


def steps(workers: int, bounds: tuple[int, int]) -> list[int]:
    """The counts one step away from ``workers`` on the ladder, within ``bounds``."""
    low, high = bounds
    rungs = sorted({w for w in LADDER if low <= w <= high} | {low, high})
    below = [w for w in rungs if w < workers]
    above = [w for w in rungs if w > workers]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def measure(state: TunerState, workers: int, round_s: float) -> TunerState:
    """``state`` with a round of ``round_s`` seconds at ``workers`` workers (the first at a count left out)."""
    measured = dict(state.measured)
    current = measured.get(workers, Measurement())
    if not current.skipped:
        current = Measurement(skipped=True)
    else:
        current = Measurement(seconds=[*current.seconds, round_s][-KEEP:], skipped=True)
    measured[workers] = current
    return state.model_copy(update={"measured": measured})


def decide(
    state: TunerState, round_: int, workers: int, objective: Objective, bounds: tuple[int, int], predict: Predict
) -> Decision:
    """The workers of round ``round_`` (the current ones are ``workers``)."""
    state = state.model_copy(update={"tuned": round_})
    here = state.measured.get(workers)
    if here is None or len(here.seconds) < DWELL:
        return Decision(workers=workers, reason=None, state=state)
    predicted = {w: predict(w) for w in (workers, *steps(workers, bounds))}

    def value(w: int) -> tuple[float, str]:
        if objective == "cost":
            return predicted[w][1], "predicted"
        tried = state.measured.get(w)
        if tried is not None and tried.seconds:
            return statistics.median(tried.seconds), "measured"
        return predicted[w][0] / predicted[workers][0] * statistics.median(here.seconds), "predicted"

    values = {w: value(w) for w in predicted}
    best = min(values, key=lambda w: values[w][0])
    now, how_now = values[workers]
    unit = "s" if objective == "time" else "$"
    if best != workers and values[best][0] <= (1 - MARGIN) * now:
        then, how_then = values[best]
        reason = (
            f"tuner ({objective}): {_amount(now, unit)} per round at {workers} workers ({how_now}), "
            f"{_amount(then, unit)} at {best} ({how_then})"
        )
        return Decision(workers=best, reason=reason, state=state)
    untried = [w for w, (seconds, how) in values.items() if how == "predicted" and seconds <= (1 + MARGIN) * now]
    if objective == "time" and untried:
        trial = min(untried, key=lambda w: values[w][0])
        reason = (
            f"tuner (time): {_amount(now, 's')} per round at {workers} workers (measured), {trial} not"
            f" tried, predicted {_amount(values[trial][0], 's')}: trying it"
        )
        return Decision(workers=trial, reason=reason, state=state)
    return Decision(workers=workers, reason=None, state=state)


def _amount(value: float, unit: str) -> str:
    return f"{value:.3g} s" if unit == "s" else f"${value:.3g}"


def predictor(config: RunConfig, compute_per_sample_s: float, limits: RunLimits | None = None) -> Predict:
    """Seconds and dollars per round by the analytic cost model (``slsml.cost.predict``, AWS's figures), for the
    run's model and pipeline with the worker compute measured (per sample, on one worker), its workers' shares in the
    micro-batches they compute (the run's sample's layer outputs); on the GPU workers of the deployment of run
    ``limits`` where it has them (``gpuworker.measured``: their instances billed, their throughput measured)."""
    from slsml.accounting import prices
    from slsml.cost import gpuworker
    from slsml.cost import predict as costmodel
    from slsml.cost.modelinfo import from_params
    from slsml.cost.parameters import Parameters, Quotas
    from slsml.cost.workload import Workload, function_memory, function_timeouts

    parameters, quotas, table = Parameters(), Quotas(), prices.load()
    spec = config.training
    workload = Workload(
        **{
            **from_params(config.plan.size, parameters, compute_per_sample_s),
            "model": "the run's",
            "trainable_params": max(1, int(config.plan.trainable_mask().sum())),
            "activation_bytes_per_sample": config.sample_bytes,
        },
        optimizer=config.optimizer,
        training=spec,
        workers=1,
        reducers=spec.reducers,
        global_batch=spec.global_batch,
        quorum=spec.quorum,
        iterations=spec.iterations,
        memory_mb=function_memory(),
        timeout_s=function_timeouts(limits),
    )
    if limits is not None and limits.worker_accelerator_gib is not None:
        workload = gpuworker.measured(workload, parameters, compute_per_sample_s, limits)

    def predict(workers: int) -> tuple[float, float]:
        plan = costmodel.predict(workload.at(workers=workers), parameters, quotas, table)
        return plan.iteration_s, plan.iteration_dollars

    return predict
