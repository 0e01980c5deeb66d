"""Benchmark ``communication``: what compressing the workers' updates saves, on the demo's CNN and digits at
W=8 workers (2 reducers, global batch 128, the demo's Adam 3e-3, evaluated every iteration). One run per
compressor, one after the other in one local runtime, each for the same fixed number of iterations:

- ``dense``: float32 updates (``compress none``);
- ``fp16``: float16 updates;
- ``topk``: the 1 % largest entries of each part (``topk:0.01``), with momentum SGD on the reducers
  (``TOPK_OPTIMIZER``, Deep Gradient Compression's recipe): Adam scales each weight's step by its own gradients'
  magnitude, so a weight whose accumulated residual is sent once in many iterations moves by about one step, not
  by the sum that error feedback kept for it;
- ``significance``: the entries whose change relative to their weight exceeds ``SIGNIFICANCE`` (MLLess).

Each encoding is compared from the first iteration (``compress_warmup`` 0): the warm-up of dense rounds and frozen
second moments that a sparse compression with an adaptive optimizer takes by default is left out.

The lossy ones always run with error feedback (``slsml.training.feedback``). For each run, to the first iteration whose
model reaches the target test accuracy and over the whole run:

- the bytes of the workers' update objects and, apart from them, of their residuals (error feedback). The update
  objects are listed in S3 with their sizes (``runs/<run>/iters/<i>/updates/``); the residuals, which the pipeline
  deletes once superseded, are what the workers' usage lines count beside their updates and evaluation states
  (``worker_usage_bytes_written``, less the update and evaluation objects listed);
- the bytes the reducers read (their usage lines: update parts, their shard objects of weights and optimizer
  state, the run's config once per process) and, of them, the update parts, from the update objects' sizes
  (``part_bytes``: quorum 1, so every update is read whole but for its header);
- the requests and dollars of the run's functions (their usage lines, priced), and the wall time;

and the test accuracy after the fixed number of iterations, with the accuracy of every iteration."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel

from slsml.accounting import prices, usage
from slsml.bench import pipeline as bench
from slsml.client import runs
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import updates
from slsml.training.updates import Compression

ACCURACY_TARGET = 0.95
WORKERS, REDUCERS, BATCH = 8, 2, 128
ITERATIONS = 150  # the default budget of every run
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=3e-3)  # the demo's
TOPK_OPTIMIZER = OptimizerConfig(name="sgd", learning_rate=0.1, momentum=0.9)
SIGNIFICANCE = 0.2  # significance's threshold: the largest of 0.01-1 that reached 0.95 about as fast as dense
COMPRESSORS = {"dense": "none", "fp16": "fp16", "topk": "topk:0.01", "significance": f"significance:{SIGNIFICANCE:g}"}
FP16_FEWER = 1.9  # fp16's update bytes at most 1/this of dense's: about half (the header is not halved)
FP16_WITHIN = 0.005  # fp16's test accuracy after the budget within this of dense's (0.5 points)
TOPK_FEWER = 20  # top-k's update bytes to the target at most 1/this of dense's

Progress = Callable[[str, int, int], None]  # (variant, iterations merged, iterations)
FOLDERS = ("updates", "evaluation")  # transient scratch: kept after the run (carried state is deleted)
_ITERATION = re.compile(r"/iters/(\d{6})/(updates|evaluation)/")


class Variant(BaseModel):
    name: str
    run_id: str
    compress: str
    spec: TrainingSpec
    iterations: int  # of the run
    wall_s: float
    final_accuracy: float | None  # after the budget
    iterations_to_target: int | None  # None: the target was not reached within the budget
    wall_to_target_s: float | None  # from the run's start to the merge of the iteration that reached it
    update_objects: int
    update_bytes: int  # the workers' update objects in S3
    update_bytes_to_target: int | None
    residual_bytes: int  # the workers' residuals (error feedback): what they wrote beside updates and evaluations
    residual_bytes_to_target: int | None
    worker_usage_bytes_written: int  # the workers' usage lines: updates, residuals and evaluation states
    reducer_bytes_read: int  # the reducers' usage lines: update parts and shard objects
    reducer_bytes_read_to_target: int | None
    reducer_update_bytes_read: int  # of them, update parts (and significance's part table entries): part_bytes
    reducer_update_bytes_read_to_target: int | None
    requests: int  # AWS requests of the run's functions
    requests_to_target: int | None
    cost_usd: float
    cost_to_target_usd: float | None
    accuracy_by_iteration: list[float | None]

    @property
    def mean_update_bytes(self) -> float:
        return self.update_bytes / self.update_objects if self.update_objects else 0.0


class CommunicationReport(BaseModel):
    workers: int
    reducers: int
    global_batch: int
    iterations: int  # the budget of every run
    target: float
    significance: float
    variants: list[Variant]
    fp16_ratio: float  # dense's update bytes over fp16's, over the budget
    fp16_fewer: bool  # at least FP16_FEWER
    fp16_accuracy_gap: float | None  # fp16's final test accuracy less dense's
    fp16_close: bool  # within FP16_WITHIN
    topk_ratio: float | None  # dense's update bytes to the target over top-k's (None: not both reached it)
    topk_fewer: bool  # at least TOPK_FEWER
    topk_best_accuracy: float | None  # top-k's best test accuracy within the budget
    topk_best_iteration: int | None  # after how many iterations (as iterations_to_target)

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def variants(
    iterations: int = ITERATIONS, workers: int = WORKERS, significance: float = SIGNIFICANCE
) -> dict[str, TrainingSpec]:
    """The runs compared: name → spec."""
    common = {
        "workers": workers,
        "reducers": REDUCERS,
        "global_batch": BATCH,
        "iterations": iterations,
        "eval_every": 1,
    }
    compressors = {**COMPRESSORS, "significance": f"significance:{significance:g}"}
    return {
        name: TrainingSpec(
            compress=compress,
            optimizer=TOPK_OPTIMIZER if name == "topk" else OPTIMIZER,
            **({"compress_warmup": 0} if Compression.parse(compress).sparse else {}),  # each encoding from the start
            **common,
        )
        for name, compress in compressors.items()
    }


class Stored(NamedTuple):
    """A run's per-iteration objects, by folder (``updates``, ``evaluation``) and iteration: their bytes,
    their count, and what the reducers read of them (``parts``: of ``updates``, see ``part_bytes``)."""

    bytes: dict[str, dict[int, int]]
    objects: dict[str, dict[int, int]]
    parts: dict[int, int]


def part_bytes(size: int, compression: Compression, reducers: int) -> int:
    """What the reducers of an iteration read of one update object of ``size`` bytes: every part, once (the parts
    tile the object after its header), and for ``significance`` not the part table but its two entries per
    reducer (``updates.table_range``)."""
    if compression.tabled:
        return size - updates.HEADER_SIZE - 8 * (reducers + 1) + 16 * reducers
    return size - updates.HEADER_SIZE


def stored_objects(services: Services, run_id: str, compression: Compression, reducers: int) -> Stored:
    """The run's ``iters/<i>/updates/`` and ``…/evaluation/`` objects, listed with their sizes."""
    found = Stored({folder: {} for folder in FOLDERS}, {folder: {} for folder in FOLDERS}, {})
    pages = services.store.s3.get_paginator("list_objects_v2").paginate(
        Bucket=services.store.bucket, Prefix=f"{keys.run_prefix(run_id)}iters/"
    )
    for page in pages:
        for listed in page.get("Contents", []):
            if (match := _ITERATION.search(listed["Key"])) is None:
                continue
            iteration, folder, size = int(match[1]), match[2], listed["Size"]
            found.bytes[folder][iteration] = found.bytes[folder].get(iteration, 0) + size
            found.objects[folder][iteration] = found.objects[folder].get(iteration, 0) + 1
            if folder == "updates":
                found.parts[iteration] = found.parts.get(iteration, 0) + part_bytes(size, compression, reducers)
    return found


def _variant(
    name: str, spec: TrainingSpec, run: runs.RunRecord, services: Services, log_dir, started: float
) -> Variant:
    counters = [services.table.get_counter(run.run_id, i) for i in range(run.iteration)]
    records = usage.read_local(log_dir, run.run_id)
    found = stored_objects(services, run.run_id, spec.compression, spec.reducers)
    table = prices.load()
    reached = runs.first_reaching(counters, ACCURACY_TARGET)
    last = run.iteration - 1

    def until(end: int) -> list[usage.UsageRecord]:
        return [r for r in records if r.iteration is None or r.iteration <= end]

    def requests(chosen: list[usage.UsageRecord]) -> int:
        return sum(sum(r.requests.values()) for r in chosen)

    def stored(folder: str, end: int) -> int:
        return sum(size for iteration, size in found.bytes[folder].items() if iteration <= end)

    def residuals(end: int) -> int:
        written = sum(
            r.bytes_written
            for r in records
            if r.function == "worker" and r.iteration is not None and r.iteration <= end
        )
        return written - stored("updates", end) - stored("evaluation", end)

    def parts_read(end: int) -> int:
        return sum(size for iteration, size in found.parts.items() if iteration <= end)

    def read(end: int) -> int:
        return sum(
            r.bytes_read for r in records if r.function == "reducer" and r.iteration is not None and r.iteration <= end
        )

    def to_target(figure: Callable[[int], int | float]) -> int | float | None:
        return None if reached is None else figure(reached)

    return Variant(
        name=name,
        run_id=run.run_id,
        compress=spec.compress,
        spec=spec,
        iterations=run.iteration,
        wall_s=round((max((c.merged_at or 0) for c in counters) or time.time()) - started, 3),
        final_accuracy=run.test_accuracy,
        iterations_to_target=None if reached is None else reached + 1,
        wall_to_target_s=None if reached is None else round((counters[reached].merged_at or 0) - started, 3),
        update_objects=sum(found.objects["updates"].values()),
        update_bytes=stored("updates", last),
        update_bytes_to_target=to_target(lambda i: stored("updates", i)),
        residual_bytes=residuals(last),
        residual_bytes_to_target=to_target(residuals),
        worker_usage_bytes_written=sum(r.bytes_written for r in records if r.function == "worker"),
        reducer_bytes_read=read(last),
        reducer_bytes_read_to_target=to_target(read),
        reducer_update_bytes_read=parts_read(last),
        reducer_update_bytes_read_to_target=to_target(parts_read),
        requests=requests(records),
        requests_to_target=to_target(lambda i: requests(until(i))),
        cost_usd=sum(usage.cost(records, table).values()),
        cost_to_target_usd=to_target(lambda i: sum(usage.cost(until(i), table).values())),
        accuracy_by_iteration=[c.test_accuracy for c in counters],
    )


def communication(
    local: LocalRuntime,
    iterations: int = ITERATIONS,
    progress: Progress | None = None,
    workers: int = WORKERS,
    significance: float = SIGNIFICANCE,
) -> CommunicationReport:
    """Run every variant on ``local`` (an entered runtime, best with ``workers`` worker processes), one after
    the other, for ``iterations`` each, and compare them."""
    services = local.services
    model_bytes = bench.demo_model(services)
    stem = launch.new_run_id("communication")
    compared = []
    for name, spec in variants(iterations, workers, significance).items():
        run, started = bench.run_to_the_end(services, model_bytes, spec, f"{stem}-{name}", name, progress)
        compared.append(_variant(name, spec, run, services, local.log_dir, started))
    return judge(compared, workers, iterations, significance)


def judge(compared: list[Variant], workers: int, iterations: int, significance: float) -> CommunicationReport:
    """The report of the runs ``compared`` (dense, fp16, topk, significance), with its verdicts."""
    by_name = {v.name: v for v in compared}
    dense, fp16, topk = by_name["dense"], by_name["fp16"], by_name["topk"]
    fp16_ratio = dense.update_bytes / fp16.update_bytes if fp16.update_bytes else 0.0
    gap = (
        None
        if fp16.final_accuracy is None or dense.final_accuracy is None
        else fp16.final_accuracy - dense.final_accuracy
    )
    topk_ratio = (
        dense.update_bytes_to_target / topk.update_bytes_to_target
        if dense.update_bytes_to_target and topk.update_bytes_to_target
        else None
    )
    scored = [(a, i + 1) for i, a in enumerate(topk.accuracy_by_iteration) if a is not None]
    best = max(scored, key=lambda pair: (pair[0], -pair[1]), default=None)
    return CommunicationReport(
        workers=workers,
        reducers=REDUCERS,
        global_batch=BATCH,
        iterations=iterations,
        target=ACCURACY_TARGET,
        significance=significance,
        variants=compared,
        fp16_ratio=fp16_ratio,
        fp16_fewer=fp16_ratio >= FP16_FEWER,
        fp16_accuracy_gap=gap,
        fp16_close=gap is not None and abs(gap) <= FP16_WITHIN,
        topk_ratio=topk_ratio,
        topk_fewer=topk_ratio is not None and topk_ratio >= TOPK_FEWER,
        topk_best_accuracy=None if best is None else best[0],
        topk_best_iteration=None if best is None else best[1],
    )
