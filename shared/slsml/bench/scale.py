"""``bench scale``: the cost model (``slsml.cost.predict``) against the real pipeline on the embedded cloud.

A grid of W workers × R reducers trains a small dense model on the digits, a few iterations each (quorum 1,
global batch 128). Per configuration:

- requests per iteration by ``service:Operation``: the plan's against the run summary's, which the functions'
  own usage lines give (``slsml.accounting.usage``), and the run's against the plan's minimum chain;
- the stages of each steady iteration (the first, with its cold containers, and the last, which completes the
  run, are left out), from the usage lines' start and end of each invocation. The stages tile the iteration,
  from one WorkLauncher's start to the next one's: WorkLauncher, Work → Worker (the first worker's start),
  Worker (to the n-th worker's end), WorkDone → ReduceLauncher, the firing ReduceLauncher, Reduce → Reducer,
  Reducer (to the last reducer's end), ReduceDone → Merger, the merging Merger, model → WorkLauncher.

The local runtime runs each function in a bounded pool of warm processes, where Lambda runs every invocation at
once, and delivers the first Work message while the WorkLauncher still publishes the others: with P processes,
W workers run in ⌈W/P⌉ waves from the first message on, a process taking its next message once it acknowledged
the previous one (the dispatch). ``local_stages`` puts these waves into the model's stages. The model's
parameters are then fitted to the stage times of the whole grid: the model is linear in its latencies, its
inverse bandwidths and the dispatch (``UNKNOWNS``), so each column of the least squares is the model evaluated
at one unit value; each configuration's stages weigh 1 / its iteration time; the unknowns are kept
non-negative; and ``s3_parallel_reads`` is tried value by value (``PARALLEL_READS``), the best fit kept.

The runtime of ``runtime()`` has one warm process per function: every process serves the first iteration
of every run, so that the iterations after it are warm throughout and their requests are steady ones.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
from pydantic import BaseModel, computed_field

from slsml.accounting import prices, usage
from slsml.accounting.usage import UsageRecord
from slsml.client import demo, runs
from slsml.cost.messages import message_bytes, publish_batches
from slsml.cost.modelinfo import from_keras_file
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.predict import predict
from slsml.cost.workload import PIPELINE, Workload, function_timeouts
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import SlsmlError
from slsml.state.records import IterationRecord, RunStatus

DATASET = "digits"
BATCH = 128
WORKERS = (1, 4, 16, 64)
REDUCERS = (1, 2, 4)
ITERATIONS = 6
LOCAL_MEMORY_MB = 1769  # one vCPU in the model: a local function process runs on one thread
DEADLINE_S = 600  # no deadline fires in a slow iteration of a busy machine
STAGES = (
    "model → WorkLauncher",
    "WorkLauncher",
    "Work → Worker",
    "Worker",
    "WorkDone → ReduceLauncher",
    "ReduceLauncher (fires)",
    "Reduce → Reducer",
    "Reducer",
    "ReduceDone → Merger",
    "Merger (merges)",
)
_CHAIN = (*STAGES[1:], STAGES[0])  # in time order within an iteration, from its launch to the next one
HOPS = ("Work → Worker", "WorkDone → ReduceLauncher", "Reduce → Reducer", "ReduceDone → Merger")
# the fit's unknowns: latencies (s), inverse bandwidths (s per MB) with the parameters they set, and the local
# runtime's dispatch, which is none of the model's (a steady iteration saves and loads no .keras: keras_mb_s,
# which times the first iteration's load alone, is not among them; nor is s3_event_s: only the first iteration waits
# for an S3 event)
LATENCIES = ("handler_s", "dynamodb_s", "s3_request_s", "sns_publish_s", "sns_lambda_s")
INVERSE_RATES = {"1/s3_mb_s": ("s3_read_mb_s", "s3_write_mb_s")}
DISPATCH = "dispatch_s"  # a busy process's next message: the previous one acknowledged, the next one received
UNKNOWNS = (*LATENCIES, *INVERSE_RATES, DISPATCH)
PARALLEL_READS = (1, 2, 4, 8, 16)  # s3_parallel_reads, the one parameter the fit tries value by value
UNBOUNDED_MB_S = 1e9  # a bandwidth whose inverse the fit sets to 0

Progress = Callable[[str, int, int], None]  # (configuration, iterations merged, iterations)


class ScalePoint(BaseModel):
    workers: int
    reducers: int
    status: str
    reason: str | None
    predicted_requests: dict[str, int]  # the plan's, per iteration
    measured_requests: dict[str, float]  # the run summary's median iteration
    minimum_requests: dict[str, int]  # the plan's minimum chain, per iteration
    compute_per_sample_s: float  # the workers' reports, median
    steady_iterations: int  # iterations the stage times are the medians of
    measured_stages: dict[str, float]  # stage → seconds, median over the steady iterations
    measured_iteration_s: float | None  # WorkLauncher start to the next one's, median over the steady iterations
    predicted_stages: dict[str, float] = {}  # the fitted model, in the local runtime's waves
    predicted_iteration_s: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mismatches(self) -> dict[str, tuple[float, float]]:
        """Operation → (predicted, measured) where they differ."""
        operations = sorted(set(self.predicted_requests) | set(self.measured_requests))
        pairs = {op: (self.predicted_requests.get(op, 0), self.measured_requests.get(op, 0)) for op in operations}
        return {op: pair for op, pair in pairs.items() if pair[0] != pair[1]}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def over_minimum(self) -> float:
        """The run's requests per iteration over the minimum chain's."""
        return sum(self.measured_requests.values()) / sum(self.minimum_requests.values())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error(self) -> float | None:
        """Relative error of the fitted model's iteration time."""
        if self.predicted_iteration_s is None or not self.measured_iteration_s:
            return None
        return (self.predicted_iteration_s - self.measured_iteration_s) / self.measured_iteration_s


class ScaleReport(BaseModel):
    model: str
    params: int
    batch: int
    iterations: int
    pools: dict[str, int]  # warm processes per function
    points: list[ScalePoint]
    fitted: dict[str, float]  # Parameters fields → values fitted to the embedded cloud: the calibration
    dispatch_s: float  # fitted too: the local runtime's, none of the model's
    median_error: float
    max_error: float


def runtime(log_dir: Path) -> LocalRuntime:
    """A local runtime with one warm process per function."""
    return LocalRuntime(workers=1, reducers=1, log_dir=log_dir, pool=1)


def dense_model(seed: int = 0):
    """A compiled dense network for the digits: 8×8 → 32 → 10 (2,410 weights)."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    return model


# ---- measuring ----------------------------------------------------------------------------------


def _first(records: Iterable[UsageRecord], operation: str) -> UsageRecord | None:
    return min((r for r in records if operation in r.requests), key=lambda r: r.start, default=None)


def measured_stages(records: list[UsageRecord], iterations: int, participants: int) -> list[dict[str, float]]:
    """The stage times of each steady iteration (1 … iterations − 2) from a run's usage records; an iteration
    that lacks an invocation of its chain (a reduce fired at a deadline) is left out."""
    by: dict[tuple[int | None, str], list[UsageRecord]] = defaultdict(list)
    for record in records:
        by[record.iteration, record.function].append(record)
    measured = []
    for i in range(1, iterations - 1):
        launch, following = (_first(by[j, "work_launcher"], "sns:PublishBatch") for j in (i, i + 1))
        fire = _first(by[i, "reduce_launcher"], "dynamodb:BatchGetItem")
        merge = _first(by[i, "merger"], "s3:PutObject")
        workers, reducers = by[i, "worker"], by[i, "reducer"]
        if (
            launch is None
            or following is None
            or fire is None
            or merge is None
            or len(workers) < participants
            or (not reducers)
        ):
            continue
        # the path's points in chain order; where an invocation's end overlaps the next stage (a launcher's
        # messages are delivered while it still records), the earlier stage ends where the next one began
        points = [
            launch.start,
            launch.end,
            min(r.start for r in workers),
            sorted(r.end for r in workers)[participants - 1],
            fire.start,
            fire.end,
            min(r.start for r in reducers),
            max(r.end for r in reducers),
            merge.start,
            merge.end,
            following.start,
        ]
        for k in range(len(points) - 2, 0, -1):
            points[k] = min(points[k], points[k + 1])
        for k in range(1, len(points)):
            points[k] = max(points[k], points[k - 1])
        spans = dict(zip(_CHAIN, itertools.pairwise(points), strict=True))
        measured.append({stage: spans[stage][1] - spans[stage][0] for stage in STAGES})
    return measured


def compute_per_sample(iterations: list[IterationRecord], steady: range) -> float:
    """Median seconds of one sample's gradient in the workers' reports of the steady iterations."""
    times = [
        r.compute_s / r.samples for it in iterations if it.iteration in steady for r in it.reports.values() if r.samples
    ]
    return statistics.median(times) if times else 0.0


# ---- the model on the local runtime -------------------------------------------------------------


def local_stages(plan: Plan, pools: Mapping[str, int], dispatch_s: float) -> dict[str, float]:
    """The plan's stages as the local runtime runs them. The first Work message is delivered while the
    WorkLauncher still publishes the others, (batches − 1) publishes before the last; with fewer processes
    than workers (``pools``), the W workers then run in ⌈W/P⌉ waves, ``dispatch_s`` apart. Likewise the Reduce
    messages and the reducers."""
    stages = {stage.name: stage.seconds for stage in plan.stages}
    if tuple(stages) != STAGES:
        raise SlsmlError(f"the cost model's stages {tuple(stages)} are not the ones measured {STAGES}")
    w = plan.workload
    publish = plan.parameters["sns_publish_s"]["value"]
    messages = message_bytes(plan.participants, math.ceil(w.global_batch / w.workers), w.reducers)
    for delivery, stage, function, count, size in (
        ("Work → Worker", "Worker", "worker", w.workers, messages[0]),
        ("Reduce → Reducer", "Reducer", "reducer", w.reducers, messages[1]),
    ):
        earlier = (publish_batches(count, size) - 1) * publish
        waves = math.ceil(count / pools[function])
        stages[delivery] -= earlier
        stages[stage] = waves * stages[stage] + (waves - 1) * dispatch_s if waves > 1 else earlier + stages[stage]
    return stages


def parameters(values: Mapping[str, float]) -> Parameters:
    """The model's parameters with the fitted ``values``: latencies, inverse bandwidths (as bandwidths) and
    ``s3_parallel_reads``."""
    changes = {name: values[name] for name in (*LATENCIES, "s3_parallel_reads") if name in values}
    for inverse, names in INVERSE_RATES.items():
        if inverse in values:
            changes |= dict.fromkeys(names, 1 / values[inverse] if values[inverse] > 0 else UNBOUNDED_MB_S)
    return Parameters().model_copy(update=changes)


def predicted_stages(workload: Workload, values: Mapping[str, float], pools: Mapping[str, int]) -> dict[str, float]:
    """The model's stages on the local runtime at the fitted ``values``."""
    plan = predict(workload, parameters(values), Quotas(), prices.PriceTable())
    return local_stages(plan, pools, values.get(DISPATCH, 0.0))


def fit(
    workloads: list[Workload], measured: list[dict[str, float]], iteration_s: list[float], pools: Mapping[str, int]
) -> dict[str, float]:
    """The unknowns and ``s3_parallel_reads`` that bring the model's local stages closest to the measured ones:
    for each of ``PARALLEL_READS``, non-negative least squares over the unknowns, each configuration's stages
    weighted by 1 / its iteration time; the best of them."""
    from scipy.optimize import nnls

    weights = np.repeat(1 / np.array(iteration_s), len(STAGES))
    target = np.array([stages[name] for stages in measured for name in STAGES])
    best: tuple[float, dict[str, float]] | None = None
    for reads in PARALLEL_READS:
        zero = dict.fromkeys(UNKNOWNS, 0.0) | {"s3_parallel_reads": reads}

        def stages(values: dict[str, float]) -> np.ndarray:
            return np.array(
                [seconds for workload in workloads for seconds in predicted_stages(workload, values, pools).values()]
            )

        base = stages(zero)
        columns = np.stack([stages(zero | {unknown: 1.0}) - base for unknown in UNKNOWNS], axis=1)
        solution, residual = nnls(columns * weights[:, None], (target - base) * weights)
        if best is None or residual < best[0]:
            best = residual, dict(zip(UNKNOWNS, solution.tolist(), strict=True)) | {"s3_parallel_reads": reads}
    assert best is not None  # one fit per candidate, and there are some
    return best[1]


def calibration(values: Mapping[str, float]) -> dict[str, float]:
    """The fitted values as the parameters ``slsml plan --calibration`` reads (the local dispatch is none)."""
    fitted = parameters(values)
    names = (*LATENCIES, *(name for names in INVERSE_RATES.values() for name in names), "s3_parallel_reads")
    return {name: float(f"{getattr(fitted, name):.4g}") for name in names}


# ---- the benchmark ------------------------------------------------------------------------------


def scale(
    local: LocalRuntime,
    workers: Iterable[int] = WORKERS,
    reducers: Iterable[int] = REDUCERS,
    iterations: int = ITERATIONS,
    progress: Progress | None = None,
) -> ScaleReport:
    """Run the grid on ``local`` (an entered runtime, best ``runtime()``), one configuration after the other;
    fit the model's latencies to the stage times."""
    if iterations < 3:
        raise SlsmlError(f"{iterations} iterations leave no steady one: give at least 3")
    from slsml.training import modelio  # TensorFlow: the model is built and saved here, never in the fit

    services = local.services
    if not services.store.exists(keys.dataset_manifest(DATASET)):
        data.put_dataset(services.store, DATASET, *demo.digits())
    model_bytes = modelio.save_model(dense_model())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dense.keras"
        path.write_bytes(model_bytes)
        figures = from_keras_file(path, BATCH, measure=False, parameters=Parameters())
    figures["model"] = "dense 8×8 → 32 → 10 on digits"
    stem = launch.new_run_id("scale")
    measured = [
        _measure(local, model_bytes, figures, f"{stem}-w{w}-r{r}", w, r, iterations, progress)
        for w in workers
        for r in reducers
    ]
    usable = [(point, workload) for point, workload in measured if point.measured_iteration_s]
    if not usable:
        raise SlsmlError("no configuration completed a steady iteration: nothing to fit")
    pools = dict(local.concurrency)
    values = fit(
        [w for _, w in usable],
        [p.measured_stages for p, _ in usable],
        [p.measured_iteration_s for p, _ in usable if p.measured_iteration_s],
        pools,
    )
    for point, workload in usable:
        point.predicted_stages = predicted_stages(workload, values, pools)
        point.predicted_iteration_s = sum(point.predicted_stages.values())
    errors = [abs(point.error) for point, _ in usable if point.error is not None]
    return ScaleReport(
        model=figures["model"],
        params=figures["params"],
        batch=BATCH,
        iterations=iterations,
        pools=pools,
        points=[point for point, _ in measured],
        fitted=calibration(values),
        dispatch_s=values[DISPATCH],
        median_error=statistics.median(errors),
        max_error=max(errors),
    )


def _measure(
    local: LocalRuntime,
    model_bytes: bytes,
    figures: dict,
    run_id: str,
    workers: int,
    reducers: int,
    iterations: int,
    progress: Progress | None,
) -> tuple[ScalePoint, Workload]:
    """Run one configuration; its figures, and its workload for the model (the compute time measured)."""
    services = local.services
    spec = TrainingSpec(
        workers=workers,
        reducers=reducers,
        global_batch=BATCH,
        iterations=iterations,
        eval_every=0,
        deadline_s=DEADLINE_S,
    )
    name = f"W {workers}, R {reducers}"
    started = time.time()
    launch.start_run(services, model_bytes, DATASET, spec, run_id=run_id)
    shown = None if progress is None else lambda run, _: progress(name, run.iteration, iterations)
    run = runs.wait_for_run(services, run_id, on_progress=shown, timeout_s=300 + 10 * workers * iterations)
    local.host.wait_idle(run_id, 60)
    records = usage.read_local(local.log_dir, run_id)
    history = services.table.list_iterations(run_id)
    summary = runs.summarize(run, history, time.time() - started, records)
    compute = compute_per_sample(history, range(1, iterations - 1))
    workload = Workload(
        **figures,
        compute_per_sample_s=compute,
        compute_source="measured: the workers' reports",
        workers=workers,
        reducers=reducers,
        global_batch=BATCH,
        iterations=iterations,
        memory_mb=dict.fromkeys(PIPELINE, LOCAL_MEMORY_MB),
        timeout_s=function_timeouts(),
    )
    plan = predict(workload, Parameters(), Quotas(), prices.PriceTable())
    completed = summary.status == RunStatus.COMPLETED
    steady = measured_stages(records, iterations, plan.participants) if completed else []
    point = ScalePoint(
        workers=workers,
        reducers=reducers,
        status=summary.status.value,
        reason=summary.reason,
        predicted_requests=plan.requests_per_iteration,
        measured_requests=summary.requests_per_iteration or {},
        minimum_requests=plan.minimum_requests_per_iteration,
        compute_per_sample_s=compute,
        steady_iterations=len(steady),
        measured_stages={stage: statistics.median(s[stage] for s in steady) for stage in STAGES} if steady else {},
        measured_iteration_s=statistics.median(sum(s.values()) for s in steady) if steady else None,
    )
    return point, workload


def write_calibration(report: ScaleReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.fitted, indent=1) + "\n")
