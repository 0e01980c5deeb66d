"""Benchmark ``algorithms``: on the demo's model and data with the same global batch, one run each in one
local runtime, one after the other:

- gradient averaging at fixed workers (2, 4, 8) and with ``--workers auto`` between 2 and 8 (the tuner,
  objective time, starting at 2);
- model averaging with K ∈ {4, 16} local steps per round at 4 workers.

Every run gets the same sample budget (so model averaging takes 1/K of the rounds) and evaluates every
round; from its counters and its functions' usage lines come the rounds, wall time, requests and dollars
until the test accuracy first reaches the target, and the accuracy the budget ends with."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel

from slsml.accounting import prices, usage
from slsml.bench import pipeline as bench
from slsml.client import runs
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec.config import OptimizerConfig, TrainingSpec

ACCURACY_TARGET = 0.95
WORKERS, BATCH = 4, 128  # model averaging's workers; the global batch of every run
FIXED_WORKERS = (2, 4, 8)  # gradient averaging's, and the tuner's bounds
SPEEDUP = 4  # model averaging with the most local steps reaches the target in at most 1/SPEEDUP of the time
TUNED_WITHIN = 1.15  # the tuned run reaches the target within this factor of the fastest fixed run's time
SAMPLE_BUDGET = 150 * BATCH  # the demo's
GRADIENT = OptimizerConfig(name="adam", learning_rate=3e-3)  # the demo's optimizer
LOCAL = {"local_optimizer": "sgd", "local_learning_rate": 0.1, "local_momentum": 0.9}  # the workers' local steps
LOCAL_STEPS = (4, 16)

Progress = Callable[[str, int, int], None]  # (variant, rounds merged, rounds)


class Variant(BaseModel):
    name: str
    description: str
    spec: TrainingSpec
    rounds: int  # of the run
    fleet: list[runs.FleetChange]  # the workers it started with, then each change
    wall_s: float
    requests: int  # AWS requests of the run's functions
    cost_usd: float
    final_accuracy: float | None  # after the sample budget
    rounds_to_target: int | None  # None: the target was not reached within the budget
    wall_to_target_s: float | None  # from the run's start to the merge of the round that reached it
    requests_to_target: int | None
    cost_to_target_usd: float | None
    accuracy_by_round: list[float | None]


class AlgorithmsReport(BaseModel):
    global_batch: int
    sample_budget: int
    target: float
    variants: list[Variant]
    averaging_ratio: float | None  # model averaging (most local steps)'s time to the target / gradient's, W=4
    averaging_fast: bool  # at most 1/SPEEDUP
    tuned_ratio: float | None  # the tuned run's time to the target / the fastest fixed run's
    tuned_close: bool  # within TUNED_WITHIN

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def variants() -> dict[str, tuple[str, TrainingSpec]]:
    """The runs compared: name → (description, spec)."""
    common = {"reducers": 2, "global_batch": BATCH, "eval_every": 1, "optimizer": GRADIENT}
    rounds = SAMPLE_BUDGET // BATCH
    compared = {
        f"gradient-w{w}": (
            f"gradient averaging, {w} workers (Adam 3e-3 on the reducers)",
            TrainingSpec(workers=w, iterations=rounds, **common),
        )
        for w in FIXED_WORKERS
    }
    low, high = min(FIXED_WORKERS), max(FIXED_WORKERS)
    compared["gradient-auto"] = (
        f"gradient averaging, workers auto {low}-{high} (tuner, objective time)",
        TrainingSpec(workers="auto", min_workers=low, max_workers=high, iterations=rounds, **common),
    )
    for k in LOCAL_STEPS:
        compared[f"average-k{k}"] = (
            f"model averaging, {WORKERS} workers, {k} local steps (SGD 0.1, momentum 0.9), FedAvg",
            TrainingSpec(
                workers=WORKERS,
                iterations=SAMPLE_BUDGET // (BATCH * k),
                algorithm="average",
                local_steps=k,
                **LOCAL,
                **common,
            ),
        )
    return compared


def measure(
    name: str,
    description: str,
    spec: TrainingSpec,
    run: runs.RunRecord,
    services,
    log_dir,
    started: float,
    target: float = ACCURACY_TARGET,
) -> Variant:
    """The figures of a COMPLETED run that started at ``started``, to ``target`` test accuracy and over the run."""
    counters = [services.table.get_counter(run.run_id, i) for i in range(run.iteration)]
    records = usage.read_local(log_dir, run.run_id)
    table = prices.load()
    reached = runs.first_reaching(counters, target)

    def until(last: int) -> list[usage.UsageRecord]:
        return [r for r in records if r.iteration is None or r.iteration <= last]

    def requests(chosen: list[usage.UsageRecord]) -> int:
        return sum(sum(r.requests.values()) for r in chosen)

    to_target = None if reached is None else until(reached)
    return Variant(
        name=name,
        description=description,
        spec=spec,
        rounds=run.iteration,
        fleet=runs.fleet(services.table.list_iterations(run.run_id)),
        wall_s=round((max((c.merged_at or 0) for c in counters) or time.time()) - started, 3),
        requests=requests(records),
        cost_usd=sum(usage.cost(records, table).values()),
        final_accuracy=run.test_accuracy,
        rounds_to_target=None if reached is None else reached + 1,
        wall_to_target_s=None if reached is None else round((counters[reached].merged_at or 0) - started, 3),
        requests_to_target=None if to_target is None else requests(to_target),
        cost_to_target_usd=None if to_target is None else sum(usage.cost(to_target, table).values()),
        accuracy_by_round=[c.test_accuracy for c in counters],
    )


def algorithms(local: LocalRuntime, progress: Progress | None = None) -> AlgorithmsReport:
    """Run every variant on ``local`` (an entered runtime with at least ``max(FIXED_WORKERS)`` worker
    processes), one after the other, and compare them."""
    services = local.services
    model_bytes = bench.demo_model(services)
    stem = launch.new_run_id("algorithms")
    compared = []
    for name, (description, spec) in variants().items():
        run, started = bench.run_to_the_end(services, model_bytes, spec, f"{stem}-{name}", name, progress)
        compared.append(measure(name, description, spec, run, services, local.log_dir, started))
    by_name = {v.name: v for v in compared}

    def ratio(numerator: Variant, denominator: Variant) -> float | None:
        a, b = numerator.wall_to_target_s, denominator.wall_to_target_s
        return a / b if a is not None and b else None

    averaging = ratio(by_name[f"average-k{max(LOCAL_STEPS)}"], by_name[f"gradient-w{WORKERS}"])
    fixed = [by_name[f"gradient-w{w}"] for w in FIXED_WORKERS if by_name[f"gradient-w{w}"].wall_to_target_s]
    fastest = min(fixed, key=lambda v: v.wall_to_target_s or 0.0) if fixed else None
    tuned = ratio(by_name["gradient-auto"], fastest) if fastest else None
    return AlgorithmsReport(
        global_batch=BATCH,
        sample_budget=SAMPLE_BUDGET,
        target=ACCURACY_TARGET,
        variants=compared,
        averaging_ratio=averaging,
        averaging_fast=averaging is not None and averaging <= 1 / SPEEDUP,
        tuned_ratio=tuned,
        tuned_close=tuned is not None and tuned <= TUNED_WITHIN,
    )
