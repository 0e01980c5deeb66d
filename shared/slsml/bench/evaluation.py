"""Benchmark ``evaluation``: how a run's evaluation scales with the test split and the workers. For each test
split size (default 10,000 and 100,000 samples of the digits' shape, 8×8×1, 10 classes, drawn at random beside
``TRAIN`` training samples) and each W (default 1, 2 and 4), the demo's CNN trains ``ITERATIONS`` iterations evaluated
at every one (global batch 64, one reducer) on the local runtime, one run after the other. Each run gives:

- the slowest worker's evaluation of its slice per round: the CPU seconds (and the wall seconds) its process spent
  evaluating its n/W samples, from the workers' ``slice evaluated`` log lines (the largest of a round's workers, the
  median over the rounds; an evaluation that traced the evaluation step, once per container, is left out as
  the container's warming). On Lambda each worker has CPUs of its own, so this, and not the machine's
  wall time, is the evaluation's critical path: it falls as 1/W wherever the machine runs it;
- the Merger's time per evaluation round: its invocations' durations summed per iteration (from the usage lines),
  the median over the iterations; every merged model is evaluated, by the workers on their slices;
- the evaluation's wall time: the round past the budget, whose workers only evaluate the final model, from its
  first worker's start to its last worker's end (and the slowest worker's duration in it): on a machine of fewer
  cores than W, the workers' processes take turns."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from slsml.accounting import usage
from slsml.bench import pipeline as bench
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.rounds.evaluation import SLICE_EVALUATED, SLICE_KEY, SliceEvaluated
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import SlsmlError

SIZES, WORKERS = (10_000, 100_000), (1, 2, 4)
ITERATIONS, TRAIN, BATCH = 6, 1_024, 64  # ITERATIONS: above the pool's processes, each of which traces once
IDLE_S = 60  # how long a run's last invocations may take to log their usage

Progress = Callable[[str, int, int], None]  # (variant, iterations merged, iterations)


class EvaluationPoint(BaseModel):
    run_id: str
    test_samples: int
    workers: int
    slice_cpu_s: float  # a round's slowest warm worker's CPU seconds evaluating its slice, the median over rounds
    slice_wall_s: float  # and its wall seconds (a round's largest)
    merger_s_per_round: float  # the median over the iterations of the Merger's summed durations
    evaluation_wall_s: float  # the final evaluation round: first worker's start to last worker's end
    slowest_worker_s: float  # the final evaluation round's slowest worker


class EvaluationReport(BaseModel):
    iterations: int
    global_batch: int
    points: list[EvaluationPoint]


def synthetic(test_samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): random 8×8×1 images in [0, 1) and labels of 10 classes."""
    rng = np.random.default_rng(seed)
    return (
        rng.random((TRAIN, 8, 8, 1), dtype=np.float32),
        rng.integers(0, 10, TRAIN),
        rng.random((test_samples, 8, 8, 1), dtype=np.float32),
        rng.integers(0, 10, test_samples),
    )


def read_slices(log_dir: Path, run_id: str) -> list[SliceEvaluated]:
    """The run's ``slice evaluated`` records in a local runtime's worker log."""
    with (log_dir / "worker.log").open() as log:
        lines = [json.loads(line) for line in log if SLICE_EVALUATED in line and run_id in line]
    records = [SliceEvaluated.model_validate(line[SLICE_KEY]) for line in lines if line["message"] == SLICE_EVALUATED]
    return [record for record in records if record.run_id == run_id]


def measure(
    run_id: str,
    test_samples: int,
    workers: int,
    iterations: int,
    records: Sequence[usage.UsageRecord],
    slices: Sequence[SliceEvaluated],
) -> EvaluationPoint:
    """A run's figures from its functions' usage records and its workers' evaluations of their test slices."""
    merger: defaultdict[int, float] = defaultdict(float)
    for r in records:
        if r.function == "merger" and r.iteration is not None and r.iteration < iterations:
            merger[r.iteration] += r.duration_s
    final = [r for r in records if r.function == "worker" and r.iteration == iterations]
    warm: defaultdict[int, list[SliceEvaluated]] = defaultdict(list)  # by round
    for s in slices:
        if s.split == "test" and not s.traced:
            warm[s.iteration].append(s)
    if not merger or not final or not warm:
        raise SlsmlError(
            f"run {run_id} ({test_samples} test samples, {workers} workers) logged no Merger, no final"
            " evaluation round or no slice evaluated by a warm worker (give more iterations than worker processes)"
        )
    return EvaluationPoint(
        run_id=run_id,
        test_samples=test_samples,
        workers=workers,
        slice_cpu_s=statistics.median(max(s.cpu_s for s in got) for got in warm.values()),
        slice_wall_s=statistics.median(max(s.wall_s for s in got) for got in warm.values()),
        merger_s_per_round=statistics.median(merger.values()),
        evaluation_wall_s=max(r.end for r in final) - min(r.start for r in final),
        slowest_worker_s=max(r.duration_s for r in final),
    )


def evaluation(
    local: LocalRuntime,
    sizes: Sequence[int] = SIZES,
    workers: Sequence[int] = WORKERS,
    iterations: int = ITERATIONS,
    progress: Progress | None = None,
) -> EvaluationReport:
    """Run every size × W on ``local`` (an entered runtime with at least max(``workers``) worker processes)."""
    from slsml.client import demo
    from slsml.training import modelio

    services = local.services
    model_bytes = modelio.save_model(demo.digits_cnn())
    stem = launch.new_run_id("evaluation")
    points = []
    for size in sizes:
        dataset = f"evaluation-{size}"
        if not services.store.exists(keys.dataset_manifest(dataset)):
            data.put_dataset(services.store, dataset, *synthetic(size))
        for count in workers:
            spec = TrainingSpec(workers=count, reducers=1, global_batch=BATCH, iterations=iterations, eval_every=1)
            run, _ = bench.run_to_the_end(
                services,
                model_bytes,
                spec,
                f"{stem}-{size}-{count}",
                f"{size} test samples, W={count}",
                progress,
                dataset,
            )
            local.host.wait_idle(run.run_id, IDLE_S)
            records, slices = usage.read_local(local.log_dir, run.run_id), read_slices(local.log_dir, run.run_id)
            points.append(measure(run.run_id, size, count, iterations, records, slices))
    return EvaluationReport(iterations=iterations, global_batch=BATCH, points=points)
