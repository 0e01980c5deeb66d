"""``slsml bench asynchronous``: fully asynchronous training (ASP, ``staleness unbounded``) against the synchronous
run (quorum 1) with one worker ``factor`` times slower than the rest. Three runs of the demo (model, data, optimizer,
global batch), one after the other in one runtime:

- the reference: no straggler, quorum 1, a few iterations: its median work phase (an iteration's launch to its
  reduce firing) sets the straggler's delay, as ``slsml bench stragglers`` sets it;
- synchronous: the last worker delayed by (factor − 1) work phases at the start of each invocation, quorum 1,
  ``iterations`` iterations;
- asynchronous: the same straggler, ``staleness unbounded``, ``iterations × workers`` iterations (under ASP an
  iteration is one worker's update, its slice of a global batch): the same samples.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from pydantic import BaseModel

from slsml.bench.pipeline import Progress, slowed, work_phase_s
from slsml.client import runs
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import SlsmlError

TIME_RATIO = 0.6  # ASP does the synchronous run's work in at most this share of its time
ACCURACY_POINTS = 1.0  # and ends within this many points of its test accuracy
REFERENCE_ITERATIONS = 10


class AsynchronousReport(BaseModel):
    workers: int
    factor: float
    straggler: int  # the slow worker
    baseline_s: float  # the reference's median work phase
    delay_s: float  # the straggler's sleep at the start of each of its invocations: (factor − 1) × baseline_s
    synchronous: runs.RunSummary
    asynchronous: runs.RunSummary
    updates_by_worker: dict[int, int]  # ASP: the updates each worker's applied
    versions: int  # ASP: the model versions that applied them (each applied the updates waiting when it fired)
    time_ratio: float  # ASP's wall time / the synchronous run's
    accuracy_points: float | None  # ASP's test accuracy − the synchronous run's, in points
    fast: bool  # time_ratio ≤ TIME_RATIO
    same_samples: bool
    close: bool  # |accuracy_points| ≤ ACCURACY_POINTS


def _shown(progress: Progress | None, name: str) -> Callable[[int, int], None] | None:
    return None if progress is None else lambda done, total: progress(name, done, total)


def asynchronous(
    local: LocalRuntime, workers: int = 4, iterations: int = 150, factor: float = 3.0, progress: Progress | None = None
) -> AsynchronousReport:
    """Run the three runs on ``local`` (an entered runtime with ``worker_pool(workers, factor)`` worker processes)
    and compare the synchronous and the asynchronous one."""
    if workers < 2 or factor <= 1:
        raise SlsmlError(f"a straggler needs at least 2 workers and a factor above 1 (got {workers}, {factor})")
    services = local.services
    stem, slow = launch.new_run_id("asynchronous"), workers - 1
    common = {"workers": workers, "reducers": 2, "global_batch": 128, "eval_every": 0}
    reference = slowed(local, TrainingSpec(iterations=REFERENCE_ITERATIONS, **common), f"{stem}-reference", None, 0)
    baseline_s = work_phase_s(services.table.list_iterations(reference.run_id))
    delay_s = (factor - 1) * baseline_s
    specs = {
        "synchronous": TrainingSpec(iterations=iterations, **common),
        "asynchronous": TrainingSpec(iterations=iterations * workers, staleness="unbounded", **common),
    }
    summaries = {
        name: slowed(local, spec, f"{stem}-{name}", _shown(progress, name), delay_s) for name, spec in specs.items()
    }
    for summary in summaries.values():
        if summary.status != "COMPLETED":
            raise SlsmlError(f"run {summary.run_id} did not complete: {summary.reason}")
    sync, asp = summaries["synchronous"], summaries["asynchronous"]
    records = [r for r in services.table.list_iterations(asp.run_id) if r.participants]
    applied = collections.Counter(p.worker for r in records for p in r.participants)
    points = (
        None
        if sync.test_accuracy is None or asp.test_accuracy is None
        else 100 * (asp.test_accuracy - sync.test_accuracy)
    )
    ratio = asp.wall_s / sync.wall_s
    return AsynchronousReport(
        workers=workers,
        factor=factor,
        straggler=slow,
        baseline_s=baseline_s,
        delay_s=delay_s,
        synchronous=sync,
        asynchronous=asp,
        updates_by_worker=dict(sorted(applied.items())),
        versions=len(records),
        time_ratio=ratio,
        accuracy_points=points,
        fast=ratio <= TIME_RATIO,
        same_samples=sync.samples_trained == asp.samples_trained,
        close=points is not None and abs(points) <= ACCURACY_POINTS,
    )
