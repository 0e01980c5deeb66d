"""Benchmark ``sparse``: MLLess's two workloads (``slsml.bench.workloads``: Criteo-like logistic regression and
MovieLens-like matrix factorization), generated, then trained on the local cloud at ``WORKERS`` workers and
``REDUCERS`` reducers, global batch ``BATCH``, Adam (``LEARNING_RATES``), every run for the same iterations and
evaluated every iteration, one after the other (after a one-iteration warm-up run, not reported: the first run would
pay the warm processes' model loading and tracing), side by side:

- ``dense``: gradient averaging (GA), float32 updates;
- ``sparse``: GA, exact sparse updates (``compress sparse``): the touched rows only;
- ``topk``: GA, ``topk:0.01`` with error feedback, from the first iteration;
- ``significance``: GA, ``significance:SIGNIFICANCE`` with error feedback (MLLess's filter), from the first iteration;
- ``dense slow`` and ``sparse slow``: GA with worker ``WORKERS - 1`` slowed by ``SLOW_S`` on every message (the
  local cloud's ``slow_worker`` fault), quorum 1: every round waits for it;
- ``ssp sparse slow``: the same slow worker under bounded staleness (SSP, ``STALENESS``), quorum 3/4: its late
  updates are folded into a later round;
- ``asp sparse slow``: the same slow worker under fully asynchronous training (ASP), sparse: ``WORKERS`` times the
  iterations, as an ASP iteration is one worker's update (the same samples), the final model evaluated only.

For each run: the wall time to the first merged model whose test loss reaches the workload's ``TARGETS`` and over the
run, the update bytes per round (the workers' update objects in S3, listed; under ASP, per ``WORKERS`` updates), the
final test loss. The reference time is
Keras's own single-process ``fit`` on this machine, of the same model on the same samples, ``BATCH`` at a time for as
many steps (the test loss evaluated after each step, off the clock)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from slsml.bench import communication
from slsml.bench import pipeline as bench
from slsml.bench.workloads import LEARNING_RATES, NAMES, Name, Workload
from slsml.local.faults import Faults, SlowWorker
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.training import modelio

WORKERS, REDUCERS, BATCH = 4, 2, 256
ITERATIONS = 30
SAMPLES, TEST_SAMPLES = 32_768, 4_096
TARGETS: dict[Name, float] = {"criteo": 0.62, "movielens": 1.0}  # test loss: binary cross-entropy, squared error
SIGNIFICANCE = 0.2  # the communication benchmark's
SLOW_S, STALENESS = 1.0, 2
SPARSE_FEWER = 10  # sparse's update bytes per round at most 1/this of dense's

Progress = Callable[[str, int, int], None]  # (variant, iterations merged, iterations)


class Variant(BaseModel):
    name: str
    description: str
    spec: TrainingSpec
    slow: bool  # worker WORKERS - 1 slowed by SLOW_S on every message
    wall_s: float  # from the run's start to its last merge
    wall_to_target_s: float | None  # to the merge of the first model at the target (None: not reached)
    update_bytes_per_round: float  # the workers' update objects of a round
    final_loss: float | None  # the test loss of the final model
    loss_by_iteration: list[float | None]


class Reference(BaseModel):
    """Keras's own single-process ``fit`` of the same model on the same samples."""

    steps: int
    train_s: float  # the steps' time, evaluation excluded
    train_to_target_s: float | None
    final_loss: float


class WorkloadReport(BaseModel):
    workload: Name
    target: float
    learning_rate: float
    params: int
    variants: list[Variant]
    reference: Reference
    sparse_ratio: float  # sparse's update bytes per round over dense's
    sparse_fewer: bool  # at most 1/SPARSE_FEWER
    sparse_exact: bool  # sparse's final test loss equals dense's

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


class SparseReport(BaseModel):
    workers: int
    reducers: int
    global_batch: int
    iterations: int
    slow_s: float
    workloads: list[WorkloadReport]


def variants(iterations: int = ITERATIONS) -> dict[str, tuple[str, TrainingSpec, bool]]:
    """The runs compared: name → (description, spec, slow worker)."""
    base = TrainingSpec(workers=WORKERS, reducers=REDUCERS, global_batch=BATCH, iterations=iterations, eval_every=1)
    slow_deadlines = {  # the watchdog must not fire the reduce without the slow worker, where quorum 1 waits for it
        "deadline_s": base.deadline_s + 2 * SLOW_S,
        "heartbeat_s": base.heartbeat_s + int(2 * (base.deadline_retries + 1) * SLOW_S) + 1,
    }

    def spec(**options: object) -> TrainingSpec:
        return TrainingSpec.model_validate({**base.model_dump(), **options})

    return {
        "dense": ("GA, float32 updates", spec(), False),
        "sparse": ("GA, exact sparse updates", spec(compress="sparse"), False),
        "topk": ("GA, top-k 1 % with error feedback", spec(compress="topk:0.01", compress_warmup=0), False),
        "significance": (
            f"GA, significance {SIGNIFICANCE:g} with error feedback",
            spec(compress=f"significance:{SIGNIFICANCE:g}", compress_warmup=0),
            False,
        ),
        "dense slow": ("GA, float32, one worker slow, quorum 1", spec(**slow_deadlines), True),
        "sparse slow": ("GA, sparse, one worker slow, quorum 1", spec(compress="sparse", **slow_deadlines), True),
        "ssp sparse slow": (
            f"SSP (staleness {STALENESS}), sparse, one worker slow, quorum 3/4",
            spec(compress="sparse", staleness=STALENESS, quorum=(WORKERS - 1) / WORKERS, **slow_deadlines),
            True,
        ),
        "asp sparse slow": (
            f"ASP, sparse, one worker slow ({WORKERS}× the iterations: one update each)",
            spec(compress="sparse", staleness="unbounded", iterations=iterations * WORKERS, **slow_deadlines),
            True,
        ),
    }


def reference(workload: Workload, model_bytes: bytes, iterations: int, target: float) -> Reference:
    """Keras's ``fit`` on the samples the runs read, ``BATCH`` at a time for ``iterations`` steps, one
    ``train_on_batch`` call each (as ``fit``'s steps), the test loss evaluated after each step off the clock."""
    model = modelio.load_model(model_bytes)
    x, y = workload.arrays(SAMPLES)
    x_test, y_test = workload.arrays(TEST_SAMPLES, stream=1)
    order = np.random.default_rng(0).permutation(SAMPLES)
    spent, reached, loss = 0.0, None, float("nan")
    for step in range(iterations):
        batch = order[(step * BATCH) % SAMPLES :][:BATCH]
        xb = {k: v[batch] for k, v in x.items()} if isinstance(x, dict) else x[batch]
        started = time.perf_counter()
        model.train_on_batch(xb, y[batch])
        spent += time.perf_counter() - started
        result = model.evaluate(x_test, y_test, batch_size=4096, verbose=0)
        loss = float(result[0] if isinstance(result, list) else result)
        if reached is None and loss <= target:
            reached = spent
    return Reference(steps=iterations, train_s=round(spent, 3), train_to_target_s=reached, final_loss=loss)


def sparse(local: LocalRuntime, iterations: int = ITERATIONS, progress: Progress | None = None) -> SparseReport:
    """Run both workloads' variants on ``local`` (an entered runtime with ``WORKERS`` worker processes)."""
    return SparseReport(
        workers=WORKERS,
        reducers=REDUCERS,
        global_batch=BATCH,
        iterations=iterations,
        slow_s=SLOW_S,
        workloads=[_workload(local, name, iterations, progress) for name in NAMES],
    )


def _workload(local: LocalRuntime, name: Name, iterations: int, progress: Progress | None) -> WorkloadReport:
    services, workload = local.services, Workload(name)
    stem = launch.new_run_id(f"sparse-{name}")
    workload.put(services.store, stem, SAMPLES, TEST_SAMPLES)
    model_bytes = workload.model()
    warm_up = variants(1)["dense"][1]
    bench.run_to_the_end(services, model_bytes, warm_up, f"{stem}-warm-up", "warm-up", None, stem)
    compared = []
    for variant, (description, spec, slow) in variants(iterations).items():
        shown = None if progress is None else lambda v, i, n, variant=variant: progress(f"{name} {variant}", i, n)
        previous = local.host.faults
        local.host.faults = Faults(slow_worker=SlowWorker(worker=WORKERS - 1, seconds=SLOW_S)) if slow else None
        try:
            run_id = f"{stem}-{variant.replace(' ', '-')}"
            run, started = bench.run_to_the_end(services, model_bytes, spec, run_id, variant, shown, stem)
        finally:
            local.host.faults = previous
        counters = [services.table.get_counter(run.run_id, i) for i in range(run.iteration)]
        if spec.asynchronous:  # the versions reduced (a version skips the numbers of the updates it applied)
            counters = [c for c in counters if c.merged_at is not None]
        losses = [c.test_loss for c in counters]
        if spec.asynchronous:  # evaluated once: the final model
            losses[-1:] = [run.test_loss]
        reached = next((i for i, loss in enumerate(losses) if loss is not None and loss <= TARGETS[name]), None)
        found = communication.stored_objects(services, run.run_id, spec.compression, spec.reducers)
        rounds = run.iteration / (WORKERS if spec.asynchronous else 1)
        compared.append(
            Variant(
                name=variant,
                description=description,
                spec=spec,
                slow=slow,
                wall_s=round(max(c.merged_at or 0 for c in counters) - started, 3),
                wall_to_target_s=None if reached is None else round((counters[reached].merged_at or 0) - started, 3),
                update_bytes_per_round=sum(found.bytes["updates"].values()) / max(1, rounds),
                final_loss=losses[-1] if losses else None,
                loss_by_iteration=losses,
            )
        )
    by_name = {v.name: v for v in compared}
    ratio = by_name["sparse"].update_bytes_per_round / by_name["dense"].update_bytes_per_round
    return WorkloadReport(
        workload=name,
        target=TARGETS[name],
        learning_rate=LEARNING_RATES[name],
        params=sum(int(np.prod(w.shape)) for w in modelio.load_model(model_bytes).weights),
        variants=compared,
        reference=reference(workload, model_bytes, iterations, TARGETS[name]),
        sparse_ratio=ratio,
        sparse_fewer=ratio <= 1 / SPARSE_FEWER,
        sparse_exact=by_name["sparse"].final_loss is not None
        and by_name["sparse"].final_loss == by_name["dense"].final_loss,
    )
