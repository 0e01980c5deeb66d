"""Fully asynchronous training (ASP, ``staleness unbounded``) on the local cloud, against the synchronous run
(quorum 1) on the same samples, with worker 3 slow on every invocation: ASP completes, trains the same samples,
ends within a point of the synchronous run's test accuracy, and no worker waits: the
fast workers take more updates than the slow one, each version applies one update, and every update applied to a
version it did not read says how stale it was. Its wall time against the synchronous run's is measured by
``slsml bench asynchronous`` (docs/benchmarks.md), not asserted here."""

from __future__ import annotations

import collections

import pytest

from slsml.client import runs
from slsml.local.faults import Faults
from slsml.spec.config import TrainingSpec

from .conftest import finish, train
from .test_faults import injecting

WORKERS, ITERATIONS = 4, 60  # the synchronous run's; ASP's: ITERATIONS × WORKERS updates, the same samples
SLOW = Faults.parse("slow_worker=3:1.5")  # worker 3 sleeps 1.5 s at the start of each invocation


@pytest.fixture(scope="module")
def pair(local, services, digits, warm) -> dict[str, runs.RunSummary]:
    common = {"workers": WORKERS, "reducers": 2, "global_batch": 128, "eval_every": 0}
    specs = {
        "sync": TrainingSpec(iterations=ITERATIONS, **common),
        "asp": TrainingSpec(iterations=ITERATIONS * WORKERS, staleness="unbounded", **common),
    }
    summaries = {}
    with injecting(local, SLOW):
        for name, spec in specs.items():
            train(services, spec, f"asynchronous-{name}")
            run = finish(services, f"asynchronous-{name}", timeout_s=900)
            summaries[name] = runs.summarize(run, services.table.list_iterations(run.run_id), 0.0)
    return summaries


def test_asp_trains_the_synchronous_runs_samples_to_within_a_point_of_its_accuracy(pair) -> None:
    sync, asp = pair["sync"], pair["asp"]
    assert (sync.status, asp.status) == ("COMPLETED", "COMPLETED"), (sync.reason, asp.reason)
    assert asp.samples_trained == sync.samples_trained > 0
    assert asp.test_accuracy is not None and sync.test_accuracy is not None
    assert abs(asp.test_accuracy - sync.test_accuracy) <= 0.01, (asp.test_accuracy, sync.test_accuracy)


def test_no_worker_waits_for_another_and_each_update_says_how_stale_it_was(services, pair) -> None:
    records = [r for r in services.table.list_iterations(pair["asp"].run_id) if r.participants]
    assert len(records) == ITERATIONS * WORKERS and all(len(r.participants) == 1 for r in records)  # one per version
    by_worker = collections.Counter(r.participants[0].worker for r in records)
    assert min(by_worker[w] for w in range(WORKERS - 1)) > by_worker[WORKERS - 1] > 0  # the slow one took fewer
    read = [r.participants[0].iteration for r in records]
    stale = [r.iteration - v for r, v in zip(records, read, strict=True) if v is not None]
    assert stale and min(stale) >= 1 and pair["asp"].staleness_max == max(stale)
