"""Benchmarks on the local runtime.

``stragglers``: what a worker that is slow on every iteration costs a run, with a quorum that lets
the reduce go ahead without it and without one. Four runs of the demo (model, data, optimizer), one
after the other in one runtime:

- (a) no straggler, quorum 1: the reference;
- (b) no straggler, quorum (W−1)/W;
- (c) the last worker delayed on every iteration, quorum (W−1)/W;
- (d) the same straggler, quorum 1;
- (e) the last worker delayed by a little more than an iteration, quorum (W−1)/W: its updates come late
  and are dropped;
- (f) the same, with bounded staleness ``STALENESS``: its late updates are folded into later reduces.

The delay makes the straggler's invocation ``factor`` times as long as (a)'s median work phase
(from an iteration's launch to its reduce firing: the slowest worker's turn, its delivery included);
``ssp_factor`` times for (e) and (f), which evaluate the test set every iteration to count the
iterations they take to the target.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from slsml.client import demo, runs
from slsml.data import datasets as data
from slsml.local.faults import Faults, SlowWorker
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import SlsmlError
from slsml.state.records import IterationRecord, RunRecord
from slsml.training import modelio

DATASET = "digits"
ACCURACY_TARGET = 0.95  # the demo's promise
WITHIN = 1.2  # (c) keeps pace when its median iteration is within this factor of (a)'s
GREW = 0.8  # (d) grew with the delay when its median iteration is longer than (a)'s by this share of the delay
BASELINE = "median work phase of (a): launch → reduce fired, the slowest worker's turn with its delivery"

Progress = Callable[[str, int, int], None]  # (case, iterations merged, iterations)
CaseName = Literal["a", "b", "c", "d", "e", "f"]
STALENESS = 2  # (f)'s


class StragglerCase(BaseModel):
    name: CaseName
    description: str
    quorum: float
    straggler: bool
    staleness: int = 0
    summary: runs.RunSummary
    ratio: float | None  # median iteration / (a)'s
    rounds_to_target: int | None = None  # (e), (f): iterations until the test accuracy reached the target


class StragglerReport(BaseModel):
    workers: int
    factor: float
    straggler: int  # the slow worker
    baseline: str  # what the delay is measured against
    baseline_s: float
    delay_s: float  # the straggler's sleep, at the start of each of its invocations: (factor − 1) × baseline_s
    cases: list[StragglerCase]  # a, b, c, d
    c_within: bool  # (c)'s median iteration is within WITHIN × (a)'s
    c_reaches_target: bool  # (c)'s test accuracy is at least ACCURACY_TARGET
    d_growth_s: float  # (d)'s median iteration minus (a)'s
    d_grew: bool  # by at least GREW × delay_s
    ssp_factor: float
    ssp_delay_s: float  # (e) and (f)'s straggler's sleep: (ssp_factor − 1) × baseline_s
    # (f)'s late updates once the benchmark ended (its summary was taken when the run ended: fewer may be in)
    f_late: int
    f_folded: int  # folded into a later reduce
    f_dropped: int  # left out, of iterations with STALENESS more after them: none, when staleness keeps every one
    f_at_the_end: int  # left out, of the last STALENESS iterations, with fewer reduces after them
    f_keeps_every_update: bool
    f_no_slower: bool  # (f) reaches the target in no more iterations than (e)

    def case(self, name: CaseName) -> StragglerCase:
        return next(c for c in self.cases if c.name == name)


def demo_model(services: Services) -> bytes:
    """The demo's CNN as a ``.keras`` file, with the digits dataset in the store (put there once)."""
    if not services.store.exists(keys.dataset_manifest(DATASET)):
        data.put_dataset(services.store, DATASET, *demo.digits())
    return modelio.save_model(demo.digits_cnn())


def run_to_the_end(
    services: Services,
    model_bytes: bytes,
    spec: TrainingSpec,
    run_id: str,
    name: str,
    progress: Progress | None,
    dataset: str = DATASET,
) -> tuple[RunRecord, float]:
    """Train ``spec`` on ``dataset`` (default the digits) as ``run_id`` and wait for it (``progress``: as variant
    ``name``); the COMPLETED run and when it started. SlsmlError if it did not complete."""
    started = time.time()
    launch.start_run(services, model_bytes, dataset, spec, run_id=run_id)
    shown = None if progress is None else lambda record, _: progress(name, record.iteration, spec.iterations)
    run = runs.wait_for_run(services, run_id, on_progress=shown, timeout_s=600 + 30 * spec.iterations)
    if run.status != "COMPLETED":
        raise SlsmlError(f"run {run_id} ({name}) did not complete: {run.reason}")
    return run, started


def rounds_to_target(records: list[IterationRecord]) -> int | None:
    reached = runs.first_reaching(records, ACCURACY_TARGET)
    return None if reached is None else reached + 1


def worker_pool(workers: int, factor: float) -> int:
    """Worker processes the benchmark needs. The straggler sleeps (factor − 1) work phases per invocation,
    and an iteration lasts at least one, so at most ⌈factor⌉ of its invocations overlap; with that many
    spare processes, none of the other workers' invocations waits (in Lambda, concurrency is elastic)."""
    return workers + math.ceil(factor)


def work_phase_s(records: list[IterationRecord]) -> float:
    """The median time from an iteration's launch to its reduce firing."""
    phases = [r.reduce_fired_at - r.launched_at for r in records if r.launched_at and r.reduce_fired_at]
    if not phases:
        raise SlsmlError("no iteration of the reference run fired its reduce: nothing to measure the delay by")
    return statistics.median(phases)


def slowed(
    local: LocalRuntime,
    spec: TrainingSpec,
    run_id: str,
    progress: Callable[[int, int], None] | None,
    delay_s: float,
    worker: int | None = None,
) -> runs.RunSummary:
    """Train ``spec`` on the demo as ``run_id`` with ``worker`` (default the last) sleeping ``delay_s`` at the start
    of each of its invocations (none: 0), and wait for it (``progress``: iterations merged, iterations); its
    summary, whatever its status. The watchdog must not act on the straggler: its deadlines are beyond its delay."""
    services = local.services
    model_bytes = demo_model(services)
    if delay_s:
        spec = TrainingSpec.model_validate(
            {
                **spec.model_dump(),
                "deadline_s": spec.deadline_s + 2 * delay_s,
                "heartbeat_s": spec.heartbeat_s + math.ceil(2 * (spec.deadline_retries + 1) * delay_s),
            }
        )
    slow = spec.initial_workers - 1 if worker is None else worker
    faults = Faults(slow_worker=SlowWorker(worker=slow, seconds=delay_s)) if delay_s else None
    previous, local.host.faults = local.host.faults, faults
    try:
        started = time.time()
        launch.start_run(services, model_bytes, DATASET, spec, run_id=run_id)
        shown = None if progress is None else lambda record, _: progress(record.iteration, spec.iterations)
        timeout_s = 600 + spec.iterations * (60 + delay_s)
        record = runs.wait_for_run(services, run_id, on_progress=shown, timeout_s=timeout_s)
    finally:
        local.host.faults = previous
    return runs.summarize(record, services.table.list_iterations(run_id), time.time() - started)


def stragglers(
    local: LocalRuntime,
    workers: int = 8,
    iterations: int = 150,
    slow_iterations: int = 15,
    factor: float = 20.0,
    progress: Progress | None = None,
    ssp_factor: float = 1.5,
) -> StragglerReport:
    """Run the six cases on ``local`` (an entered runtime with ``worker_pool(workers, factor)`` worker
    processes) and compare them. (c) runs last: its straggler's invocations still asleep when it ends
    do not overlap another case."""
    if workers < 2 or factor <= 1:
        raise SlsmlError(f"a straggler needs at least 2 workers and a factor above 1 (got {workers}, {factor})")
    services = local.services
    stem = launch.new_run_id("stragglers")
    slow, quorum, q = workers - 1, (workers - 1) / workers, f"{workers - 1}/{workers}"
    described: dict[CaseName, tuple[str, float, bool]] = {  # description, quorum, straggler
        "a": ("no straggler, quorum 1", 1.0, False),
        "b": (f"no straggler, quorum {q}", quorum, False),
        "c": (f"worker {slow} delayed every iteration, quorum {q}", quorum, True),
        "d": (f"worker {slow} delayed every iteration, quorum 1", 1.0, True),
        "e": (f"worker {slow} delayed a little over an iteration, quorum {q}", quorum, True),
        "f": (f"the same, staleness {STALENESS}: late updates folded in", quorum, True),
    }

    def run(name: CaseName, budget: int, delay_s: float = 0.0) -> runs.RunSummary:
        staleness = {"eval_every": 1} if name in ("e", "f") else {"eval_every": 0}
        if name == "f":
            staleness["staleness"] = STALENESS
        spec = TrainingSpec(
            workers=workers, reducers=2, global_batch=128, iterations=budget, quorum=described[name][1], **staleness
        )
        shown = None if progress is None else lambda done, total: progress(name, done, total)
        return slowed(local, spec, f"{stem}-{name}", shown, delay_s, slow)

    summaries = {"a": run("a", iterations)}
    if summaries["a"].status != "COMPLETED":
        raise SlsmlError(f"the reference run (a) did not complete: {summaries['a'].reason}")
    baseline_s = work_phase_s(services.table.list_iterations(summaries["a"].run_id))
    delay_s = (factor - 1) * baseline_s
    summaries["b"] = run("b", iterations)
    summaries["d"] = run("d", slow_iterations, delay_s)
    ssp_delay_s = (ssp_factor - 1) * baseline_s
    summaries["e"] = run("e", iterations, ssp_delay_s)
    summaries["f"] = run("f", iterations, ssp_delay_s)
    summaries["c"] = run("c", iterations, delay_s)
    rounds = {name: rounds_to_target(services.table.list_iterations(summaries[name].run_id)) for name in "ef"}

    reference = summaries["a"].median_iteration_s

    def ratio(name: CaseName) -> float | None:
        median = summaries[name].median_iteration_s
        return median / reference if median and reference else None

    cases = [
        StragglerCase(
            name=name,
            description=description,
            quorum=case_quorum,
            straggler=straggler,
            staleness=summaries[name].training.staleness_bound,
            summary=summaries[name],
            ratio=ratio(name),
            rounds_to_target=rounds.get(name),
        )
        for name, (description, case_quorum, straggler) in described.items()
    ]
    f = summaries["f"]
    f_records = services.table.list_iterations(f.run_id)
    left_out = {r.iteration: len(r.late - r.nonfinite - r.folded) for r in f_records}
    f_dropped = sum(n for i, n in left_out.items() if i < f.iterations - STALENESS)
    f_folded = sum(len(r.folded) for r in f_records)
    c, d = summaries["c"], summaries["d"]
    growth = (d.median_iteration_s or 0.0) - (reference or 0.0)
    c_ratio = ratio("c")
    return StragglerReport(
        workers=workers,
        factor=factor,
        straggler=slow,
        baseline=BASELINE,
        baseline_s=baseline_s,
        delay_s=delay_s,
        cases=cases,
        c_within=c_ratio is not None and c_ratio <= WITHIN,
        c_reaches_target=c.test_accuracy is not None and c.test_accuracy >= ACCURACY_TARGET,
        d_growth_s=growth,
        d_grew=growth >= GREW * delay_s,
        ssp_factor=ssp_factor,
        ssp_delay_s=ssp_delay_s,
        f_late=sum(len(r.late - r.nonfinite) for r in f_records),
        f_folded=f_folded,
        f_dropped=f_dropped,
        f_at_the_end=sum(left_out.values()) - f_dropped,
        f_keeps_every_update=f_dropped == 0 and f_folded > 0,
        f_no_slower=rounds["f"] is not None and (rounds["e"] is None or rounds["f"] <= rounds["e"]),
    )
