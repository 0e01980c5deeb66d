"""The analytic time and cost model of one training run: requests, bytes, time per stage, dollars,
quotas, and the reducers and memory to choose. Pure arithmetic over the pipeline's request chain;
TensorFlow is imported only to read a ``.keras`` file and time one gradient step of it.

One iteration, steady state (warm containers, no faults, no duplicates), W workers, R reducers, quorum
q, n = ⌈q·W⌉ participants, M = 4·params bytes, P = M/R bytes per shard, k optimizer state slots:

| function (invocations) | requests per invocation | S3 bytes |
|---|---|---|
| WorkLauncher (1) | GetItem 1, UpdateItem 1, PublishBatch ⌈W/10⌉ | – |
| Worker (W) | GetItem 1 (its check), GetObject R + 1, PutObject 1, PublishBatch 1 | reads M, writes M + 32 |
| ReduceLauncher (W) | HeadObject 1 (its check: the update's own report), PutItem 1, UpdateItem 1; | – |
| | the firing one also UpdateItem 1, BatchGetItem ⌈W/100⌉, PutItem 1, PublishBatch ⌈R/per batch⌉ | |
| Reducer (R) | GetItem 1 (its check), GetObject n + 1, PutObject 1, PublishBatch 1 | reads n·P + P(1+k), |
| | | writes P(1+k) |
| Merger (R) | HeadObject 1 (its check), UpdateItem 1; the merging one also ListObjectsV2 1, UpdateItem 2, | – |
| | PutObject 1, DeleteObjects ⌈(R + slots)/1000⌉ (the superseded carried state) | writes the manifest |

A worker reads the weights entering its iteration from the R shards the reducers stored (one ranged GET each,
concurrently with the iteration's manifest, which names their ETags); the Merger only lists the shards and stores
the manifest, whose S3 event launches the next iteration. It saves the model (``models/<i>.keras``) only where the
run may end on it (the final one, and each one a watched split is evaluated on) and at checkpoints: not in a steady
iteration.

The checks are each message's against the run it names (``slsml.pipeline.admission``).

The minimum chain is what any at-least-once pipeline of this shape must do: the data plane above (S3),
one message per hop, one check of each message that a forged one could make act (2W + 2R), one durable
write per report (W + R), the launch's read and claim, one read of the reports at the fire (⌈W/100⌉
BatchGetItem) and one write per barrier fire (2). The chain's calls beyond
it, each with its reason, are ``chain_extras``.

The critical path of an iteration: the manifest's S3 event → WorkLauncher → the n-th worker's Work
message → Worker → ReduceLauncher (fires) → the last Reduce message → Reducer → Merger (merges) →
the next manifest. It can be no shorter than the DynamoDB floor: the iteration counter item takes
W + R + 3 writes, at most ``dynamodb_partition_wu_s`` a second.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slsml import rules
from slsml.accounting import capacity, prices
from slsml.aws.cache import MEMORY_SHARE
from slsml.aws.storage import DELETE_BATCH
from slsml.cost.datatraffic import DataTraffic, data_traffic
from slsml.data.manifest import DEFAULT_SHARD_MB, DatasetManifest
from slsml.pipeline import bus
from slsml.rounds import accumulate, sizing
from slsml.spec import keys
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS, STAGE_FUNCTIONS
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits
from slsml.spec.messages import MAX_MESSAGE_BYTES, Manifest, Participant, ReduceMessage, WorkDone, WorkMessage
from slsml.state import runtable as runstate
from slsml.state.barrier import quorum_count
from slsml.state.records import dynamo
from slsml.training import feedback, optimizers, progress, updates

PIPELINE = ("work_launcher", "worker", "reduce_launcher", "reducer", "merger")
IMAGE_FUNCTIONS = ("worker", "merger")  # container images with TensorFlow; the others are zip + layer
MEMORY_CHOICES_MB = (512, 1024, 1769, 2048, 3008, 3538, 4096, 5307, 7076, 8845, 10240)
LONGEST_FLOAT = -1.2345678901234567e-300  # the most bytes a float64 takes in JSON and in DynamoDB
REDUCER_CHOICES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
SWEEP_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
_VCPU_MB = 1769  # one vCPU; Lambda allocates CPU in proportion to memory, 6 vCPUs at 10,240 MB


def _param(default: float, unit: str, what: str, source: str, positive: bool = False) -> Any:
    extra: dict[str, Any] = {"unit": unit, "source": source}
    if positive:
        return Field(default=default, description=what, json_schema_extra=extra, gt=0)
    return Field(default=default, description=what, json_schema_extra=extra, ge=0)


class Parameters(BaseModel):
    """Every figure the model rests on, with its published or measured source. Override any of them
    with ``--param name=value`` or a calibration file (a JSON object of fitted values)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s3_event_s: float = _param(
        1.0,
        "s",
        "the manifest's PUT → S3 event → SNS ModelUpdated",
        "S3 docs: event notifications 'typically seconds, sometimes a minute or longer'",
    )
    sns_lambda_s: float = _param(0.073, "s", "SNS → Lambda delivery", "published p50 73 ms (p90 125 ms, p99 225 ms)")
    sns_publish_s: float = _param(
        0.02, "s", "one PublishBatch call", "estimate: one in-region HTTPS round trip; calibrate"
    )
    s3_request_s: float = _param(
        0.04,
        "s",
        "S3 request latency (first byte)",
        "FuncPipe §3.3: under 40 ms from Lambda (LambdaML Table 6: 80 ± 20 ms)",
    )
    s3_read_mb_s: float = _param(
        65.0,
        "MB/s",
        "S3 read bandwidth of one function",
        "LambdaML Table 6: 65 ± 7 MB/s; 50–70 MB/s re-measured in 2026",
        True,
    )
    s3_write_mb_s: float = _param(65.0, "MB/s", "S3 write bandwidth of one function", "as s3_read_mb_s", True)
    s3_parallel_reads: float = _param(16, "GETs", "concurrent GETs of one reader", "slsml.aws.storage.get_many", True)
    sns_parallel_publishes: float = _param(
        bus.PARALLEL_BATCHES,
        "PublishBatch",
        "concurrent PublishBatch calls of one publisher",
        "slsml.pipeline.bus",
        True,
    )
    dynamodb_s: float = _param(0.005, "s", "one DynamoDB request", "DynamoDB docs: single-digit milliseconds")
    handler_s: float = _param(0.005, "s", "warm invocation overhead (parse, log)", "estimate; calibrate")
    cold_start_zip_s: float = _param(
        0.5,
        "s",
        "cold start of a zip function (numpy layer)",
        "Lambda docs: cold starts 'from under 100 ms to over 1 second'",
    )
    cold_start_image_s: float = _param(
        6.0, "s", "cold start of the TensorFlow image", "TensorFlow 2.21 import ~6 s, measured (DESIGN.md)"
    )
    vcpu_efficiency: float = _param(0.8, "", "TensorFlow's speed-up per vCPU beyond the first", "estimate; calibrate")
    compute_s_per_param_sample: float = _param(
        1.92e-8,
        "s",
        "gradient time per sample and weight on one vCPU (--params only)",
        "ResNet-50 on 224×224×3: 0.49 s per sample on one core, TF 2.21, measured",
    )
    activation_bytes_per_param_sample: float = _param(
        5.8,
        "B",
        "layer outputs kept for the backward pass, per sample and weight (--params only)",
        "ResNet-50 on 224×224×3: 148 MB of layer outputs per sample, counted",
    )
    keras_file_overhead: float = _param(
        0.0064,
        "",
        ".keras file bytes beyond the weights, relative (--params only)",
        "ResNet-50: 103,199,296 B file for 102,546,848 B of weights, measured",
    )
    significance_density: float = _param(
        0.01,
        "",
        "fraction of a part's trainable entries a significance:V update sends",
        "estimate: depends on V and the model; calibrate",
    )
    keras_mb_s: float = _param(
        73.0, "MB/s", "saving or loading a .keras file, one vCPU", "ResNet-50 .keras saved in 1.41 s, measured", True
    )
    average_ns: float = _param(
        1.0, "ns", "weighted sum of one part, per weight (reducer)", "numpy on one core: 0.7 ns, measured"
    )
    optimizer_ns: float = _param(10.6, "ns", "optimizer step per weight (reducer)", "numpy Adam on one core, measured")
    tf_runtime_mb: float = _param(
        sizing.TF_RUNTIME_MB,
        "MB",
        "memory of a TensorFlow function before the model",
        "RSS after importing TensorFlow 2.21, measured (slsml.rounds.sizing)",
    )
    python_runtime_mb: float = _param(
        50,
        "MB",
        "memory of a zip function before its data",
        "RSS after importing numpy, boto3, pydantic, Powertools, measured",
    )
    worker_model_copies: float = _param(
        sizing.MODEL_COPIES,
        "× M",
        "model-sized buffers of a worker's step beside its warm cache (its micro-batches' float64 sum adds 2 more)",
        "steps/worker: gradients, flat update, encoded update, weights read; the model is the cache's (rounds.sizing)",
    )
    merger_model_copies: float = _param(
        4,
        "× M",
        "model-sized buffers of the merger",
        "steps/merger: shards read, flat weights, model weights, saved file",
    )
    record_bytes: float = _param(200, "B", "one worker's record item", "the pipeline's table layout")
    participant_bytes: float = _param(30, "B", "one participant in the participants item", "the table layout")
    counter_item_bytes: float = _param(500, "B", "the iteration counter item", "the table layout: under 1 KB")
    run_item_bytes: float = _param(1000, "B", "the run's META item", "the table layout: ~1 KB")
    log_bytes_per_invocation: float = _param(
        1000, "B", "CloudWatch log bytes per invocation", "estimate: START/END/REPORT lines and one usage line"
    )
    zip_layer_mb: float = _param(
        95, "MB", "unzipped zip function + layer", "numpy, pydantic, Powertools, slsml as installed, measured"
    )
    image_mb: float = _param(
        2000,
        "MB",
        "TensorFlow container image",
        "TensorFlow 2.21 + keras installed 1.3 GB, measured, on the Lambda base image",
    )


class Quotas(BaseModel):
    """AWS default quotas (raise some by request: ``--quota name=value``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lambda_concurrency: int = Field(1000, gt=0, description="concurrent executions per region (account)")
    lambda_burst_per_10s: int = Field(1000, gt=0, description="new execution environments per 10 s per function")
    lambda_memory_mb: int = Field(10240, gt=0, description="memory of one function")
    lambda_timeout_s: int = Field(900, gt=0, description="duration of one invocation")
    zip_mb: int = Field(250, gt=0, description="unzipped zip function + layers")
    image_mb: int = Field(10240, gt=0, description="container image")
    dynamodb_item_bytes: int = Field(400 * 1024, gt=0, description="one item")
    dynamodb_partition_wu_s: int = Field(1000, gt=0, description="write units per second on one partition")
    s3_put_per_s: int = Field(3500, gt=0, description="PUT/COPY/POST/DELETE per second per prefix")
    s3_get_per_s: int = Field(5500, gt=0, description="GET/HEAD per second per prefix")
    sns_message_bytes: int = Field(256 * 1024, gt=0, description="one SNS message")


class Workload(BaseModel):
    """What is trained and how: the model's size and speed, the pipeline's shape, the run's length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="where the model's figures come from")
    params: int = Field(gt=0, description="float32 weights")
    trainable_params: int = Field(gt=0)
    metric_values: int = Field(
        default=2, ge=2, description="the values of the loss's and metrics' state a worker tracks (2: the loss alone)"
    )
    model_file_bytes: int = Field(gt=0)
    sample_bytes: int | None = Field(default=None, description="one training sample in the dataset")
    activation_bytes_per_sample: float = Field(ge=0)
    compute_per_sample_s: float = Field(ge=0, description="one sample's gradient on one vCPU")
    compute_source: str
    optimizer: OptimizerConfig = OptimizerConfig()
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="the run's training options: its update rule (algorithm, local"
        " steps and state, server), compression and staleness; the workers, reducers, batch, quorum and iterations"
        " are the workload's own",
    )
    workers: int = Field(gt=0)
    reducers: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    quorum: float = Field(default=1.0, gt=0, le=1)
    iterations: int = Field(gt=0)
    samples: int | None = Field(default=None, gt=0, description="training samples (an epoch)")
    shard_records: int | None = Field(
        default=None,
        gt=0,
        description="samples per dataset shard (default: the shards slsml writes of the sample's size)",
    )
    cache_mb: float | None = Field(
        default=None,
        gt=0,
        description="the workers' warm cache bound (SLSML_WARM_CACHE_MB; default half a Worker's memory)",
    )
    memory_mb: dict[str, int]
    timeout_s: dict[str, int]

    @property
    def run_spec(self) -> TrainingSpec:
        """The training options of a run of this workload: ``training`` with its workers, reducers, batch, quorum
        and iterations (not validated: ``check`` does that)."""
        return self.training.model_copy(
            update={
                "workers": self.workers,
                "reducers": self.reducers,
                "global_batch": self.global_batch,
                "quorum": self.quorum,
                "iterations": min(self.iterations, 999_999),
            }
        )

    @property
    def iterations_per_epoch(self) -> int | None:
        return None if self.samples is None else max(1, self.samples // self.global_batch)

    def at(self, **changes: Any) -> Workload:
        return self.model_copy(update=changes)


# ---- inputs ------------------------------------------------------------------------------------


def measured_batch(spec: TrainingSpec) -> int:
    """The samples of the gradient step a plan times: a worker's share of the global batch, at most 32 and at most
    the run's micro-batch (a worker computes no more at once)."""
    return max(1, min(32, math.ceil(spec.global_batch / spec.initial_workers), spec.micro_batch or 32))


def run_workload(
    figures: Mapping[str, Any],
    spec: TrainingSpec,
    samples: int | None = None,
    manifest: DatasetManifest | None = None,
    cache_mb: float | None = None,
    memory: Mapping[str, int] | None = None,
    limits: RunLimits | None = None,
) -> Workload:
    """The workload of the run ``spec`` of a model of these ``figures`` (``from_keras``, ``from_params``): on the
    dataset of ``manifest`` (its samples, their bytes and its shards), else of ``samples``; with the workers'
    ``cache_mb``, the functions' ``memory`` (default: a default deployment's) and the timeouts of the deployment
    whose run ``limits`` are given (``function_timeouts``)."""
    figures = dict(figures)
    if manifest is not None:  # the dataset's own figures
        figures.update(sample_bytes=manifest.record_bytes, shard_records=manifest.shard_records)
        samples = manifest.train.count
    if spec.optimizer is not None:
        figures["optimizer"] = spec.optimizer
    return Workload(
        **figures,
        training=spec,
        workers=spec.initial_workers,
        reducers=spec.reducers,
        global_batch=spec.global_batch,
        quorum=spec.quorum,
        iterations=spec.iterations,
        samples=samples,
        cache_mb=cache_mb,
        memory_mb=dict(memory or function_memory()),
        timeout_s=function_timeouts(limits),
    )


def function_memory(overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each pipeline function's memory: the deployment's defaults, then ``overrides``."""
    memory = {name: DEFAULT_FUNCTIONS[name].memory_mb for name in PIPELINE}
    for name, mb in (overrides or {}).items():
        if name not in memory:
            raise BadInputError(f"no pipeline function named {name!r} (one of {', '.join(PIPELINE)})")
        if not 128 <= mb <= 10240:
            raise BadInputError(f"{name} memory {mb} MB is outside Lambda's 128–10,240 MB")
        memory[name] = mb
    return memory


def function_timeouts(limits: RunLimits | None = None) -> dict[str, int]:
    """Each pipeline function's timeout: a default deployment's, and those of the functions a stage waits on as the
    deployment of run ``limits`` (its stack's, or the local service's) sets them."""
    stages = (limits or RunLimits()).function_timeouts_s
    return {name: stages.get(name, DEFAULT_FUNCTIONS[name].timeout_s) for name in PIPELINE}


def state_slots(optimizer: OptimizerConfig) -> int:
    """Optimizer state arrays as large as the trainable weights (Adam 2, SGD with momentum 1, SGD 0)."""
    return sum(1 for value in optimizers.initial_state(optimizer, 1).values() if value.ndim == 1)


def load_overrides(calibration: str | Path | None, pairs: Iterable[str], model: type[BaseModel]) -> tuple[Any, dict]:
    """``model`` with values from a calibration JSON file, then ``name=value`` pairs; and where each
    overridden value came from."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if calibration:
        path = Path(calibration)
        try:
            fitted = json.loads(path.read_text())
        except FileNotFoundError:
            raise BadInputError(f"calibration file {path} does not exist") from None
        except json.JSONDecodeError as error:
            raise BadInputError(f"calibration file {path} is not JSON: {error}") from None
        if not isinstance(fitted, dict):
            raise BadInputError(f"calibration file {path} must hold a JSON object of parameter values")
        values.update(fitted)
        origin.update(dict.fromkeys(fitted, f"calibration {path.name}"))
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise BadInputError(f"{pair!r}: write name=value")
        values[name.strip()] = value.strip()
        origin[name.strip()] = "given"
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise BadInputError(f"unknown {model.__name__.lower()} {unknown}; known: {', '.join(model.model_fields)}")
    try:
        return model(**values), origin
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise BadInputError(f"{model.__name__.lower()}: {problems}") from None


def from_params(params: int, parameters: Parameters, compute_per_sample_s: float | None = None) -> dict[str, Any]:
    """The model's figures from its size alone (a ResNet-50-like network on 224×224 images)."""
    if params <= 0:
        raise BadInputError(f"--params {params}: a model has at least one weight")
    compute = compute_per_sample_s
    source = "given (--compute-per-sample)"
    if compute is None:
        compute = params * parameters.compute_s_per_param_sample
        source = "estimated from the parameter count (ResNet-50-like): give --compute-per-sample or --model"
    return {
        "model": "model (--params)",
        "params": params,
        "trainable_params": params,
        "model_file_bytes": round(4 * params * (1 + parameters.keras_file_overhead)),
        "activation_bytes_per_sample": params * parameters.activation_bytes_per_param_sample,
        "compute_per_sample_s": compute,
        "compute_source": source,
    }


def from_keras_file(
    path: str | Path,
    batch: int,
    measure: bool,
    parameters: Parameters,
    loss: str | None = None,
    manifest: DatasetManifest | None = None,
) -> dict[str, Any]:
    """The model's figures from a ``.keras`` file (``from_keras``)."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"model file {path} does not exist")
    return from_keras(path.read_bytes(), path.name, str(path), batch, measure, parameters, loss, manifest)


def from_keras(
    data: bytes,
    name: str,
    where: str,
    batch: int,
    measure: bool,
    parameters: Parameters,
    loss: str | None = None,
    manifest: DatasetManifest | None = None,
) -> dict[str, Any]:
    """The figures of the ``.keras`` archive ``data`` (``name``, read from ``where``), its metrics' state as a run of
    ``loss`` (None: the compiled one) on the dataset of ``manifest`` tracks it (``metric_values``); with
    ``measure``, one timed gradient step, converted from TensorFlow's threads here to one vCPU with
    ``parameters.vcpu_efficiency`` (see ``pin_one_thread``)."""
    from slsml.training import modelio

    model = modelio.load_model(data, where=where)
    specs = modelio.variable_specs(model)
    inputs = modelio.model_inputs(model)  # several: a sample is all of them
    shapes = [i.shape for i in inputs] if inputs else [model.input_shape]
    if any(not isinstance(s, tuple) or (s and isinstance(s[0], tuple | list)) for s in shapes):
        raise BadInputError(f"{where}: the plan reads models of flat inputs; give --params and --compute-per-sample")
    figures: dict[str, Any] = {
        "model": name,
        "params": sum(s.size for s in specs),
        "trainable_params": sum(s.size for s in specs if s.trainable),
        "model_file_bytes": len(data),
        "sample_bytes": sum(4 * math.prod(d or 1 for d in shape[1:]) for shape in shapes),
        "activation_bytes_per_sample": sizing.sample_bytes(model),
    }
    with suppress(BadInputError):  # not compiled, or not an optimizer the reducers apply: the default stands
        figures["optimizer"] = modelio.optimizer_config(model)
    run_loss = None
    with suppress(BadInputError):  # no loss, compiled or given: the run cannot start, and the loss alone stands
        run_loss = modelio.loss_config(model, loss)
    if run_loss is not None:
        figures["metric_values"] = metric_values(model, run_loss, manifest)
    if measure:
        threads = _threads()
        seconds = measure_step(model, specs, batch)
        figures["compute_per_sample_s"] = seconds / batch * _speedup(threads, parameters.vcpu_efficiency)
        figures["compute_source"] = f"measured: one gradient step of {batch} samples on {threads:g} thread(s) here"
    return figures


def metric_values(model: Any, loss: str, manifest: DatasetManifest | None = None) -> int:
    """The values of the loss's and compiled metrics' state each worker of a run of ``model`` and ``loss`` (its
    JSON) sends in its WorkDone: the size of the run's ``Evaluator``, its metrics resolved as ``run start`` resolves
    them, built on two samples of labels as the dataset of ``manifest`` holds them (None: shaped as the model's
    outputs, class ids for a sparse loss). BadInputError if they are more than a worker's report may carry."""
    from slsml.training import evaluation, modelio

    classification = (manifest is not None and manifest.classes is not None) or modelio.classifies(loss)
    metrics = modelio.metrics_config(model, classification)
    x, y = _sample(model, 2, lambda output: "sparse" in json.dumps(modelio.output_loss(loss, output)))
    if manifest is not None:  # the dataset's labels, as a worker reads them
        y = (
            {a.name: np.zeros((2, *a.shape), a.dtype) for a in manifest.y_arrays}
            if manifest.y_arrays is not None
            else np.zeros((2, *(manifest.y_shape or ())), manifest.y_dtype)
        )
    evaluator = evaluation.Evaluator(model, loss, metrics, (x, y))
    evaluation.check_size(evaluator)
    return evaluator.size


def _sample(model: Any, batch: int, sparse: Callable[[str], bool] = lambda output: False) -> tuple[Any, Any]:
    """``batch`` random inputs of ``model`` (several: by input name) and zero labels shaped as its outputs (several:
    by output name), class ids of an output ``sparse`` names."""
    from slsml.training import modelio

    rng = np.random.default_rng(0)

    def sized(shape: Any) -> tuple[int, ...]:
        return (batch, *(d or 1 for d in shape[1:]))

    def label(output: str, shape: Any) -> np.ndarray:
        return np.zeros(sized(shape)[:-1], np.int32) if sparse(output) else np.zeros(sized(shape), np.float32)

    inputs = modelio.model_inputs(model) or []
    x = (
        {i.name: rng.random(sized(i.shape), dtype=np.float32) for i in inputs}  # several inputs: by name
        if len(inputs) > 1
        else rng.random(sized(model.input_shape), dtype=np.float32)
    )
    outputs = modelio.output_names(model)
    if len(outputs) > 1:
        return x, {name: label(name, shape) for name, shape in zip(outputs, model.output_shape, strict=True)}
    return x, label(outputs[0] if outputs else "", model.output_shape)


def pin_one_thread() -> None:
    """Run TensorFlow on one thread (a measured step is then per vCPU), if it has not started yet."""
    import tensorflow as tf

    with suppress(RuntimeError):  # already running: it keeps its threads, and _threads() says how many
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _threads() -> float:
    import os

    import tensorflow as tf

    return float(tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0)))


def measure_step(model: Any, specs: list, batch: int) -> float:
    """Seconds of one gradient step of ``batch`` random samples (after one untimed step that traces it)."""
    import time

    from slsml.spec.shardplan import ShardPlan
    from slsml.training import modelio

    several = len(modelio.output_names(model)) > 1  # the loss of each output, on labels by output name
    loss = json.dumps({"loss": "mean_squared_error", "loss_weights": None} if several else "mean_squared_error")
    trainer = modelio.Trainer(model, ShardPlan.build(specs, 1), loss)
    x, y = _sample(model, batch)
    trainer.compute_update(x, y)
    started = time.perf_counter()
    trainer.compute_update(x, y)
    return time.perf_counter() - started


def check(workload: Workload, parameters: Parameters, quotas: Quotas) -> None:
    """Raise BadInputError for settings that cannot run at all, naming the limit and by how much; not for a function
    over its memory, which the plan answers with its figures and the memory to give (``MEMORY_QUOTAS``)."""
    w = workload
    if w.workers > quotas.lambda_concurrency:
        raise BadInputError(
            f"{w.workers} workers need {w.workers} concurrent Lambda executions: over the account's concurrency "
            f"quota of {quotas.lambda_concurrency:,} by {w.workers - quotas.lambda_concurrency:,} "
            "(ask AWS for more and give --quota lambda_concurrency=N)"
        )
    if w.global_batch < w.workers:
        raise BadInputError(
            f"global batch {w.global_batch} is smaller than the {w.workers} workers by "
            f"{w.workers - w.global_batch}: every worker needs at least one sample"
        )
    if w.reducers > w.params:
        raise BadInputError(
            f"{w.reducers} reducers but the model has only {w.params} weights: "
            f"{w.reducers - w.params} reducers would own no shard"
        )
    if w.samples is not None and w.global_batch > w.samples:
        raise BadInputError(f"global batch {w.global_batch} is larger than the {w.samples} training samples")
    try:
        TrainingSpec.model_validate(w.run_spec.model_dump(exclude={"min_workers", "max_workers", "objective"}))
    except ValidationError as error:
        raise BadInputError(
            "; ".join(f"{e['loc'][0] if e['loc'] else 'training'}: {e['msg']}" for e in error.errors())
        ) from None
    stages = RunLimits(function_timeouts_s={name: w.timeout_s[name] for name in STAGE_FUNCTIONS})
    if refusal := stages.deadline_refusal(w.training.deadline_s):  # the deployment FAILS such a run at its start
        raise BadInputError(refusal)
    plan = predict(workload, parameters, quotas, prices.PriceTable())
    problems = [q.detail for q in plan.quotas if q.hard and not q.ok and q.name not in MEMORY_QUOTAS]
    if problems:
        raise BadInputError("; ".join(problems))


# ---- outputs -----------------------------------------------------------------------------------


class Stage(BaseModel):
    name: str
    function: str | None = Field(description="the function that runs it; None for a hop between functions")
    seconds: float
    detail: str


class FunctionFigures(BaseModel):
    function: str
    invocations: int
    memory_mb: int
    seconds: float = Field(description="the invocation on the critical path")
    gb_seconds: float = Field(description="all invocations of one iteration")
    bytes_read: int = Field(description="S3, the invocation on the critical path")
    bytes_written: int
    bytes_read_total: int = Field(description="S3, all invocations of one iteration")
    bytes_written_total: int
    memory_needed_mb: float


class QuotaCheck(BaseModel):
    name: str
    value: float
    limit: float
    unit: str
    ok: bool
    hard: bool = Field(
        description="the run cannot work at all (the plan refuses it, but for memory: it answers, naming the memory"
        " to give); else it is slowed or throttled"
    )
    detail: str

    @property
    def utilization(self) -> float:
        return self.value / self.limit


class FirstIteration(BaseModel):
    """What the first iteration (cold containers) adds on top of a steady one."""

    extra_s: float
    extra_requests: dict[str, int]
    extra_dollars: float
    detail: str


class ExtraCall(BaseModel):
    """Calls of the chain beyond its minimum, and why they are made."""

    operation: str = Field(description="service:Operation")
    count: int = Field(description="per iteration")
    call: str
    reason: str


class Continuations(BaseModel):
    """A worker's round that would outlast the Worker's timeout goes on in fresh invocations of the same attempt,
    handed on between micro-batches (``slsml.training.progress``): how many, and what they add to an iteration."""

    timeout_s: float = Field(description="the Worker's timeout (at most Lambda's)")
    invocations: int = Field(description="Worker invocations one round takes (1: it fits one)")
    micro_batches_per_invocation: int = Field(
        description="micro-batches an invocation computes before it hands the round on (a step is the plan's"
        " micro_batches of them)"
    )
    progress_bytes: int = Field(description="one round's progress, stored by each invocation that hands on")
    calls: list[ExtraCall] = Field(description="every worker's calls of handing on, per iteration")
    bytes_read: int = Field(description="S3, every worker's continuations of one iteration")
    bytes_written: int
    seconds: float = Field(description="what handing on adds to a round")

    @property
    def handed_on(self) -> int:
        """Times one round is handed on."""
        return self.invocations - 1


class Plan(BaseModel):
    workload: Workload
    participants: int
    state_slots: int
    requests_per_iteration: dict[str, int] = Field(description="by service:Operation, as botocore names them")
    minimum_requests_per_iteration: dict[str, int] = Field(description="the minimum chain, by service:Operation")
    extra_calls: list[ExtraCall] = Field(description="the chain's calls beyond the minimum")
    read_units: float
    write_units: float
    sns_billed_publishes: int
    stages: list[Stage]
    functions: list[FunctionFigures]
    chain_s: float = Field(description="the critical path of one iteration")
    floor_s: float = Field(description="the iteration counter item's writes at the partition's write rate")
    iteration_s: float
    epoch_s: float | None
    run_s: float
    dollars_per_iteration: dict[str, float]
    first_iteration: FirstIteration
    quotas: list[QuotaCheck]
    parameters: dict[str, dict[str, Any]]
    data: DataTraffic | None = Field(
        default=None, description="the workers' data reads (with --samples and the sample's bytes)"
    )
    micro_batch: int = Field(
        description="a worker's micro-batch, at most its share of a batch: --micro-batch, else the most samples that"
        " fit its memory (slsml.rounds.sizing; 1 where not one does); a step's micro-batches are as even as can be"
    )
    micro_batches: int = Field(description="micro-batches of a worker's step, their gradients added up")
    continuations: Continuations = Field(description="a round that outlasts the Worker's timeout, handed on")

    @property
    def iteration_dollars(self) -> float:
        return sum(self.dollars_per_iteration.values())

    @property
    def epoch_dollars(self) -> float | None:
        per_epoch = self.workload.iterations_per_epoch
        return None if per_epoch is None else per_epoch * self.iteration_dollars

    @property
    def run_dollars(self) -> float:
        return self.workload.iterations * self.iteration_dollars + self.first_iteration.extra_dollars

    @property
    def requests_ratio(self) -> float:
        """Requests per iteration over those of the minimum chain."""
        return sum(self.requests_per_iteration.values()) / sum(self.minimum_requests_per_iteration.values())

    @property
    def violations(self) -> list[QuotaCheck]:
        return [q for q in self.quotas if not q.ok]

    @property
    def binding(self) -> QuotaCheck:
        """The quota closest to (or furthest past) its limit: the first to bind as load grows (the package sizes,
        which the configuration does not change, only when they are exceeded)."""
        return max((q for q in self.quotas if q.name not in STATIC_QUOTAS or not q.ok), key=lambda q: q.utilization)

    def summary(self) -> dict[str, Any]:
        """The plan as one JSON-ready object."""
        out = self.model_dump(mode="json")
        out["iterations_per_epoch"] = self.workload.iterations_per_epoch
        out["dollars"] = {"iteration": self.iteration_dollars, "epoch": self.epoch_dollars, "run": self.run_dollars}
        for check, row in zip(self.quotas, out["quotas"], strict=True):
            row["utilization"] = check.utilization
        out["binding"] = binding_sentence(self)
        out["requests_ratio"] = self.requests_ratio
        return out


# ---- the model ---------------------------------------------------------------------------------


def vcpus(memory_mb: float) -> float:
    """Lambda's CPU share: in proportion to memory, 1 vCPU at 1,769 MB, 6 at 10,240 MB."""
    if memory_mb <= _VCPU_MB:
        return memory_mb / _VCPU_MB
    return 1 + (memory_mb - _VCPU_MB) * 5 / (10240 - _VCPU_MB)


def _speedup(cpus: float, efficiency: float) -> float:
    """How many times faster than one vCPU TensorFlow runs on ``cpus``."""
    return cpus if cpus <= 1 else 1 + (cpus - 1) * efficiency


@lru_cache(maxsize=256)
def message_bytes(participants: int, samples: int, reducers: int) -> tuple[int, int]:
    """(Work, Reduce) message sizes as the pipeline serializes them, for a run id of the longest form."""
    run_id = "r" * 63
    work = WorkMessage(run_id=run_id, iteration=999_999, worker=participants - 1, workers=participants)
    reduce = ReduceMessage(
        run_id=run_id,
        iteration=999_999,
        shard=reducers - 1,
        participants=tuple(Participant(worker=w, samples=samples) for w in range(participants)),
    )
    return len(work.model_dump_json().encode()), len(reduce.model_dump_json().encode())


@lru_cache(maxsize=256)
def done_bytes(workers: int, samples: int, metric_values: int) -> int:
    """A WorkDone message as the pipeline serializes it, its metrics state of ``metric_values`` values and every
    figure at the longest a float takes, for a run id of the longest form."""
    done = WorkDone(
        run_id="r" * 63,
        iteration=999_999,
        worker=workers - 1,
        samples=samples,
        loss=LONGEST_FLOAT,
        metrics=[LONGEST_FLOAT] * metric_values,
        compute_s=-LONGEST_FLOAT,
    )
    return len(done.model_dump_json().encode())


@lru_cache(maxsize=256)  # every predicted variant of a run adds the same state: counted once
def state_item_bytes(metric_values: int) -> int:
    """What a metrics state of ``metric_values`` values adds to a DynamoDB item (a worker's record's ``metrics``,
    the counter's ``train_state`` once the reduce fired), every value at the longest a float takes."""
    return capacity.item_bytes(dynamo({"train_state": [LONGEST_FLOAT] * metric_values}))


def largest_reduce(spec: TrainingSpec, workers: int | None = None) -> tuple[int, int]:
    """The most participants a Reduce message of a run of ``spec`` (its iterations resolved; ``workers``: as
    ``TrainingSpec.asked_workers``) can list, and that message's bytes: every worker, at its last attempt, and
    with bounded staleness the late updates of the ``staleness`` iterations before, each of which may have fired
    with the deadline floor's fewest workers; each participant at the largest figures it may carry, for a run id
    of the longest form."""
    workers = spec.asked_workers(workers)
    late = spec.staleness * (workers - quorum_count(workers, min(spec.deadline_floor, spec.quorum)))
    samples, attempt = spec.global_batch * spec.local_batches, spec.deadline_retries
    return _largest_reduce(workers, late, samples, attempt, (spec.iterations or 1_000_000) - 1, spec.reducers - 1)


@lru_cache(maxsize=256)  # a plan's recommendation predicts thousands of variants of one run: one message each
def _largest_reduce(workers: int, late: int, samples: int, attempt: int, iteration: int, shard: int) -> tuple[int, int]:
    participants = [Participant(worker=w, attempt=attempt, samples=samples) for w in range(workers)]
    participants += [
        Participant(worker=w % workers, attempt=attempt, samples=samples, iteration=iteration) for w in range(late)
    ]
    reduce = ReduceMessage(
        run_id="r" * 63, iteration=iteration, shard=shard, attempt=attempt, participants=tuple(participants)
    )
    return len(participants), len(reduce.model_dump_json().encode())


def listed(spec: TrainingSpec, participants: int, workers: int | None = None) -> str:
    """Who the ``participants`` of a run's largest Reduce message (``largest_reduce``) are, in words."""
    workers = spec.asked_workers(workers)
    late = (
        (
            f", and with staleness {spec.staleness} and deadline_floor {spec.deadline_floor:g} up to"
            f" {participants - workers:,} late updates folded in"
        )
        if spec.staleness
        else ""
    )
    return f"{participants:,} participants ({workers} workers{late})"


def check_messages(spec: TrainingSpec, workers: int | None = None) -> None:
    """BadInputError, naming the options that make it so, if a run of ``spec`` (``workers``: as
    ``TrainingSpec.asked_workers``) could send a message over the size slsml's functions take
    (``MAX_MESSAGE_BYTES``)."""
    participants, size = largest_reduce(spec, workers)
    if size > MAX_MESSAGE_BYTES:
        raise BadInputError(
            f"a Reduce message of this run may list {listed(spec, participants, workers)}:"
            f" {size:,} B, over the {MAX_MESSAGE_BYTES:,} B slsml's messages may hold; lower the workers"
            + (" or staleness, or raise deadline_floor" if spec.staleness else "")
        )


def publish_batches(messages: int, message_size: int) -> int:
    """PublishBatch calls for ``messages`` of one size (``slsml.pipeline.bus``: 10 entries, 256 KiB a batch)."""
    per_batch = max(1, min(bus.BATCH_ENTRIES, bus.BATCH_BYTES // message_size))
    return math.ceil(messages / per_batch)


class NormExchange(BaseModel):
    """What clipping by norm across shards adds to an iteration (``slsml.training.clipping``)."""

    requests: dict[str, int] = Field(default_factory=dict)
    released: int = Field(default=0, description="reducers stepped by a second invocation, released by another")
    release_bytes: int = 0


def norm_exchange(optimizer: OptimizerConfig, reducers: int, reduce_bytes: int) -> NormExchange:
    """Nothing unless the optimizer clips by norm with R > 1: then each reducer stores its average and its
    sums of squares and counts them; the last one reads them all, claims the release and publishes it to
    the R - 1 others, which read their average back."""
    R = reducers
    if R == 1 or not optimizer.clips_by_norm:
        return NormExchange()
    entries = 1 if optimizer.global_clipnorm else R - 1  # the global sum, or each cut variable's
    squares = json.dumps({"squares": {str(10**5 + i): LONGEST_FLOAT for i in range(entries)}})
    release_bytes = reduce_bytes + len(squares)
    return NormExchange(
        requests={
            "dynamodb:PutItem": R,
            "dynamodb:UpdateItem": R + 1,
            "dynamodb:GetItem": R - 1,
            "dynamodb:BatchGetItem": math.ceil(R / runstate.BATCH_READ),
            "s3:PutObject": R,
            "s3:GetObject": R - 1,
            "sns:PublishBatch": publish_batches(R - 1, release_bytes),
        },
        released=R - 1,
        release_bytes=release_bytes,
    )


class RoundTraffic(BaseModel):
    """What the run's update rule (``slsml.rules``), compression and staleness make a round move."""

    compute_steps: int = Field(description="gradient computations of a worker's round, each on its local batch")
    update_bytes: int = Field(description="one worker's update object")
    part_bytes: int = Field(description="the largest shard's part of an update, as a reducer reads it")
    table_reads: int = Field(description="ranged GETs of an update's part table before its part (significance)")
    slot_bytes: int = Field(description="one worker slot's stored state (the rule's; 0: none)")
    residual_bytes: int = Field(description="one worker slot's error-feedback residual (0: none)")
    late_queries: int = Field(description="iterations the reduce fire looks at for late updates (staleness)")
    server: OptimizerConfig = Field(description="what the reducers step with")

    def worker_requests(self, workers: int) -> dict[str, int]:
        """Per steady round: each worker reads the objects its slot stored the round before and stores its own."""
        objects = workers * (bool(self.slot_bytes) + bool(self.residual_bytes))
        return {"s3:GetObject": objects, "s3:PutObject": objects}


def round_traffic(w: Workload, p: Parameters) -> RoundTraffic:
    """The round of the workload's update rule and options."""
    spec, rule, R = w.training, rules.of(w.training), w.reducers
    compression = spec.compression
    trainable, other = w.trainable_params, w.params - w.trainable_params
    significance = compression.kind == "significance"

    def part(t: int, o: int) -> int:
        return updates.part_bytes(compression, t, o, math.ceil(p.significance_density * t))

    # R parts of near-equal trainable and other entries: shard r holds one more of each below its remainder
    (low_t, extra_t), (low_o, extra_o) = divmod(trainable, R), divmod(other, R)
    both = min(extra_t, extra_o)
    total = (
        both * part(low_t + 1, low_o + 1)
        + (extra_t - both) * part(low_t + 1, low_o)
        + (extra_o - both) * part(low_t, low_o + 1)
        + (R - max(extra_t, extra_o)) * part(low_t, low_o)
    )
    return RoundTraffic(
        compute_steps=rule.compute_steps(spec),
        update_bytes=updates.HEADER_SIZE + (updates.table_bytes(R) if significance else 0) + total,
        part_bytes=part(math.ceil(trainable / R), math.ceil(other / R)),
        table_reads=int(significance),
        slot_bytes=rule.slot_traffic(spec, w.params, w.trainable_params).bytes,
        residual_bytes=feedback.residual_bytes(w.params) if compression.lossy else 0,
        late_queries=spec.staleness,
        server=rule.server_optimizer(spec, w.optimizer),
    )


class MicroBatches(NamedTuple):
    """How a worker of some memory computes its share of each global batch (``slsml.rounds``)."""

    size: int  # the most samples it computes at once
    per_step: int  # micro-batches of a step
    fitting: int  # the most samples that fit a step (0: not one)
    needed_mb: float  # the memory its step takes


def micro_batching(w: Workload, p: Parameters, traffic: RoundTraffic, memory_mb: int) -> MicroBatches:
    """The micro-batches of a worker of ``memory_mb`` as it sizes them (``slsml.rounds.sizing``): the run's
    ``micro_batch``, else the most samples that fit beside its warm cache (``cache_mb``, else ``MEMORY_SHARE`` of its
    memory), one where not even one does; and the memory its largest micro-batch's step takes."""
    memory = sizing.WorkerMemory(
        memory_mb,
        MEMORY_SHARE * memory_mb if w.cache_mb is None else w.cache_mb,
        4 * w.params,
        w.activation_bytes_per_sample,
        2 * traffic.slot_bytes + 2 * traffic.residual_bytes,
    )
    share, fitting = math.ceil(w.global_batch / w.workers), memory.micro_batch()
    size = min(share, w.training.micro_batch or max(1, fitting))
    count = memory.micro_batches(share, size)
    # the runtime and model buffers of the parameters beyond the worker's own estimate (overridden: calibrated)
    calibrated = (
        p.tf_runtime_mb - sizing.TF_RUNTIME_MB + (p.worker_model_copies - sizing.MODEL_COPIES) * 4e-6 * w.params
    )
    return MicroBatches(size, count, fitting, memory.needed_mb(accumulate.sizes(share, size)[0], count) + calibrated)


def superseded_deletes(spec: TrainingSpec, reducers: int, traffic: RoundTraffic) -> int:
    """DeleteObjects requests of the Merger's delete of the carried state the iteration superseded
    (``slsml.pipeline.steps.common.carried_state``): the R shards and, where the run keeps them, the slot states and
    residuals of every worker the run may have."""
    slots = spec.worker_bounds[1] * (bool(traffic.slot_bytes) + bool(traffic.residual_bytes))
    return math.ceil((reducers + slots) / DELETE_BATCH)


def minimum_chain(
    workers: int,
    reducers: int,
    participants: int,
    work_batches: int,
    reduce_batches: int,
    traffic: RoundTraffic,
    deletes: int,
) -> dict[str, int]:
    """The requests of one steady iteration that any at-least-once pipeline of this shape and update rule makes."""
    W, R, n = workers, reducers, participants
    slots = traffic.worker_requests(W)  # what the worker slots keep between rounds: read once, stored once
    return {
        # the launch reads the run; the checks of Work (its iteration's counter) and Reduce (its participants)
        "dynamodb:GetItem": 1 + W + R,
        "dynamodb:UpdateItem": 1 + R + 1,  # the launch claim, one durable write per shard report, the merge fire
        "dynamodb:PutItem": W + 1,  # one durable write per worker report, the reduce fire (its participants)
        "dynamodb:BatchGetItem": math.ceil(W / runstate.BATCH_READ),  # the reports, read once at the fire
        # each worker's trigger (the manifest, which names the shards by ETag) and weights, a part of each shard; each
        # reducer's parts and shard
        "s3:GetObject": W * (1 + R) + R * n + R + slots["s3:GetObject"],
        "s3:HeadObject": W + R,  # the checks of each WorkDone (its update's own report), each ReduceDone (its shard)
        # the merge's look that every shard is stored (the count is a hint: a duplicate counts twice)
        "s3:ListObjectsV2": 1,
        "s3:PutObject": W + R + 1 + slots["s3:PutObject"],  # updates, shards, the next iteration's trigger
        # the carried state a stopped run would resume from is kept untagged (no lifecycle rule expires it), so the
        # state each iteration supersedes is deleted (DELETE requests are free)
        "s3:DeleteObjects": deletes,
        "sns:PublishBatch": work_batches + W + reduce_batches + R,  # one message per hop
    }


def option_extras(reducers: int, participants: int, traffic: RoundTraffic, counted: int = 0) -> list[ExtraCall]:
    """The calls beyond the minimum chain that the run's options add, each with why it is made. ``counted``: the
    invocations of an iteration that add their cost to the run's spend (a run with a budget; else 0)."""
    extras = []
    if counted:
        extras += [
            ExtraCall(
                operation="dynamodb:UpdateItem",
                count=counted,
                call="each invocation's addition of its cost to the run's spend",
                reason="a budget stops the run on its spend as it goes, which each"
                " function counts as it runs (not read from its logs after the fact)",
            ),
            ExtraCall(
                operation="dynamodb:GetItem",
                count=1,
                call="the launch's read of the run's spend",
                reason="the launch of each iteration stops the run whose spend reached its budget",
            ),
        ]
    if traffic.table_reads:
        extras.append(
            ExtraCall(
                operation="s3:GetObject",
                count=reducers * participants * traffic.table_reads,
                call="each reducer's read of its two entries of every update's part table",
                reason="significance parts vary in size, so a reducer learns where its part lies before reading it",
            )
        )
    if traffic.late_queries:
        extras.append(
            ExtraCall(
                operation="dynamodb:Query",
                count=traffic.late_queries,
                call="the reduce fire's look for late updates",
                reason=f"bounded staleness folds the late updates of the last {traffic.late_queries} iterations",
            )
        )
    return extras


def chain_extras(
    workers: int, reducers: int, participants: int, traffic: RoundTraffic, counted: int = 0
) -> list[ExtraCall]:
    """The chain's calls beyond the minimum one, each with why it is made (``counted``: ``option_extras``')."""
    return [
        *option_extras(reducers, participants, traffic, counted),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=workers,
            call="the counter update per worker report",
            reason="the O(1) signal that the barrier may be complete, without reading every record on every report",
        ),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=1,
            call="the reduce fire's mark on the counter",
            reason="the participants item is the fire; its list grows with W, so it cannot live on the "
            "counter that every report rewrites, where the mark turns late reports away",
        ),
        ExtraCall(
            operation="dynamodb:UpdateItem",
            count=1,
            call="the run advance, apart from the merge fire",
            reason="the run item (status, iteration, token) and the iteration counter are different items; "
            "the advance is also the heartbeat and the stop check",
        ),
    ]


def continuations(
    w: Workload,
    p: Parameters,
    traffic: RoundTraffic,
    timeout_s: float,
    setup_s: float,
    compute_s: float,
    read_weights_s: float,
    micro_batches: int,
) -> Continuations:
    """The continuations of one round of ``compute_s`` compute (its samples read meanwhile), each of its steps in
    ``micro_batches`` micro-batches, in Worker invocations of ``timeout_s``, each first spending ``setup_s`` (what it
    reads before computing), as the worker's pacer decides them (``progress.Pacer``): an invocation computes
    micro-batches while the time left is above ``progress.reserve_s``, and one at least. What it hands on is the local
    steps' weights and optimizer state (a rule of local steps) and, where a step has several micro-batches, those
    added up so far."""
    spec, rule = w.training, rules.of(w.training)
    K, M = traffic.compute_steps, 4 * w.params
    total = K * micro_batches
    stored = progress.stored_bytes(
        w.params,
        w.trainable_params,
        spec.local_optimizer_config(),
        K,
        w.metric_values,
        local_weights=ALGORITHMS[spec.algorithm].local,
        partial=micro_batches > 1,
    )
    micro_s = compute_s / total
    usable = timeout_s - setup_s - progress.reserve_s(stored, micro_s, p.s3_write_mb_s)
    per = total if micro_s == 0 else min(total, 1 + math.floor(max(0.0, usable) / micro_s))
    handed = math.ceil(total / per) - 1
    reread = traffic.residual_bytes + (traffic.slot_bytes if rule.rereads_slot else 0)
    W = w.workers
    calls = [
        ExtraCall(operation=operation, count=W * handed * count, call=call, reason=HAND_ON_REASON)
        for operation, count, call in (
            ("s3:PutObject", 1, "the progress each invocation that hands its round on stores"),
            ("dynamodb:UpdateItem", 1, "its record that the round goes on (the watchdog waits for it)"),
            ("sns:PublishBatch", 1, "its Work message to the fresh invocation"),
            ("dynamodb:GetItem", 1, "the continuation's check of its iteration"),
            ("s3:HeadObject", 1, "the continuation's check of the progress it names"),
            ("dynamodb:PutItem", 1, "the continuation's record, handled once"),
            ("dynamodb:UpdateItem", 1, "the continuation's record, completed"),
            (
                "s3:GetObject",
                2 + w.reducers + bool(traffic.residual_bytes) + (rule.rereads_slot and bool(traffic.slot_bytes)),
                "the continuation's reads: the progress, the weights entering the round (the manifest, the shards)"
                + (", the slot's residual" if traffic.residual_bytes else "")
                + (", the slot's state" if rule.rereads_slot and traffic.slot_bytes else ""),
            ),
        )
        if handed
    ]
    hand_on_s = (
        _transfer(1, stored, p.s3_request_s, p.s3_write_mb_s)
        + p.dynamodb_s
        + p.sns_publish_s
        + p.sns_lambda_s
        + p.handler_s
        + 3 * p.dynamodb_s
        + p.s3_request_s
        + _transfer(1, stored, p.s3_request_s, p.s3_read_mb_s)
        + read_weights_s
    )
    return Continuations(
        timeout_s=timeout_s,
        invocations=handed + 1,
        micro_batches_per_invocation=per,
        progress_bytes=stored,
        calls=calls,
        bytes_read=W * handed * (stored + M + reread),
        bytes_written=W * handed * stored,
        seconds=handed * hand_on_s,
    )


HAND_ON_REASON = "the round outlasts the Worker's timeout: it goes on in fresh invocations of the same attempt"


def in_micro_batches(count: int, micro_batch: int) -> str:
    """``count`` micro-batches of ``micro_batch`` samples at most, in words."""
    samples = "1 sample" if micro_batch == 1 else f"≤ {micro_batch:,} samples"
    return f"{count:,} micro-batch{'' if count == 1 else 'es'} of {samples}"


def step_in_words(micro_batch: int, micro_batches: int) -> str:
    """How a worker computes its step's share, in words: at once, or in micro-batches."""
    return "at once" if micro_batches == 1 else f"in {in_micro_batches(micro_batches, micro_batch)}"


def _handed(handing: Continuations, micro_batch: int, micro_batches: int) -> str:
    """What each invocation of a round handed on computes, in words: local steps of one micro-batch each, else
    micro-batches."""
    per = handing.micro_batches_per_invocation
    return f"{per:,} local step{'' if per == 1 else 's'}" if micro_batches == 1 else in_micro_batches(per, micro_batch)


def manifest_bytes(reducers: int) -> int:
    """An iteration's manifest (``slsml.spec.messages.Manifest``) of R shards' ETags, at the largest iteration."""
    etag = '"' + "0" * 32 + '"'
    return len(Manifest(iteration=999_999, shards=[etag] * reducers).model_dump_json())


def _units(item_bytes: float, unit_bytes: int) -> int:
    return max(1, math.ceil(item_bytes / unit_bytes))


def _transfer(requests: float, size: float, latency: float, mb_s: float, parallel: float = 1) -> float:
    """Seconds to move ``size`` bytes in ``requests`` requests, ``parallel`` at a time."""
    return math.ceil(requests / max(1, parallel)) * latency + size / (mb_s * 1e6)


def predict(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> Plan:
    """The plan of one configuration: requests, bytes, time and dollars per iteration; quotas."""
    w, p = workload, parameters
    W, R, B = w.workers, w.reducers, w.global_batch
    n = quorum_count(W, w.quorum)
    traffic = round_traffic(w, p)
    k = state_slots(traffic.server)
    M, F, U = 4 * w.params, w.model_file_bytes, traffic.update_bytes
    manifest_b = manifest_bytes(R)
    slot_b, residual_b = traffic.slot_bytes, traffic.residual_bytes
    shard_weights = 4 * math.ceil(w.params / R)  # the largest shard: the reducer on the critical path
    part = traffic.part_bytes  # its part of one update
    shard_state = k * 4 * min(math.ceil(w.params / R), w.trainable_params)  # at most: every weight trainable
    mean_weights, mean_state = M / R, k * 4 * w.trainable_params / R
    local_batch = math.ceil(B / W)
    work_bytes, reduce_bytes = message_bytes(n, local_batch, R)
    report_bytes = done_bytes(W, local_batch * w.training.local_batches, w.metric_values)
    state_b = state_item_bytes(w.metric_values)  # on each worker's record, and on the counter from the fire on
    record_b, counter_b = p.record_bytes + state_b, p.counter_item_bytes + state_b
    work_batches = publish_batches(W, work_bytes)
    reduce_batches = publish_batches(R, reduce_bytes)
    pages = math.ceil(W / runstate.BATCH_READ)  # the fire reads the W records by key
    mem = w.memory_mb
    steps = micro_batching(w, p, traffic, mem["worker"])
    data = workload_data(w, p)
    data_gets = round(data.gets_per_iteration) if data else 0

    requests = {
        "dynamodb:GetItem": 1 + W + R,
        "dynamodb:UpdateItem": 1 + W + 1 + R + 2,
        "dynamodb:PutItem": W + 1,
        "dynamodb:BatchGetItem": pages,
        "s3:GetObject": W * (R + 1) + R * (n + 1) + data_gets,
        "s3:HeadObject": W + R,
        "s3:ListObjectsV2": 1,
        "s3:PutObject": W + R + 1,
        "s3:DeleteObjects": superseded_deletes(w.training, R, traffic),
        "sns:PublishBatch": work_batches + W + reduce_batches + R,
    }
    exchange = norm_exchange(traffic.server, R, reduce_bytes)
    lat, ddb, pub, hop = p.s3_request_s, p.dynamodb_s, p.sns_publish_s, p.sns_lambda_s

    def publishing(batches: int) -> float:
        """Seconds of ``batches`` PublishBatch calls, ``sns_parallel_publishes`` at a time."""
        return math.ceil(batches / p.sns_parallel_publishes) * pub

    worker_cpus = _speedup(vcpus(mem["worker"]), p.vcpu_efficiency)
    read_weights = _transfer(R, M, lat, p.s3_read_mb_s, p.s3_parallel_reads)  # the manifest's read: alongside
    compute_s = traffic.compute_steps * local_batch * w.compute_per_sample_s / worker_cpus
    # the samples are read a micro-batch at a time, ahead of the one computing: the first with the weights, the
    # others while the micro-batches before them compute
    data_s = data.read_s if data else 0.0
    first_s = data_s / (traffic.compute_steps * steps.per_step)
    read_s = max(read_weights, first_s)
    streamed_s = max(compute_s, data_s - first_s)
    worker_timeout = min(w.timeout_s["worker"], quotas.lambda_timeout_s)
    handing = continuations(
        w, p, traffic, worker_timeout, p.handler_s + ddb + read_s, streamed_s, read_weights, steps.per_step
    )
    invocations = 1 + 2 * W + 2 * R + exchange.released + W * handing.handed_on
    counted = invocations if w.training.budget_usd is not None else 0  # each adds its cost to the run's spend
    for operation, count in (
        *exchange.requests.items(),
        *traffic.worker_requests(W).items(),
        *((e.operation, e.count) for e in option_extras(R, n, traffic, counted)),
        *((e.operation, e.count) for e in handing.calls),
    ):
        requests[operation] = requests.get(operation, 0) + count
    # claim and counts; then the fire (the train metrics' state), shard counts, merge; with the norm exchange its
    # counts and release
    fired_writes = 1 + R + 1 + (R + 1 if exchange.released else 0)
    counter_units = (1 + W) * _units(p.counter_item_bytes, 1024) + fired_writes * _units(counter_b, 1024)
    write_units = (
        counter_units
        + W * _units(record_b, 1024)  # the reports, with their metrics' state
        + ((R if exchange.released else 0) + 3 * W * handing.handed_on) * _units(p.record_bytes, 1024)
        + _units(n * p.participant_bytes, 1024)
        + _units(p.run_item_bytes, 1024)
        + counted
    )  # the spend item: a number
    read_units = (
        _units(p.run_item_bytes, 4096)  # BatchGetItem: per item
        + W * _units(record_b, 4096)
        + (R if exchange.released else 0) * _units(p.record_bytes, 4096)
        + traffic.late_queries * _units(W * record_b + counter_b, 4096)
        + W
        * (1 + handing.handed_on)
        * _units(p.counter_item_bytes, 4096)  # checks: Work's counter, Reduce's participants
        + (R + exchange.released) * _units(n * p.participant_bytes, 4096)
        + bool(counted)
    )  # the launch's read of the spend
    sns_billed = (
        W * (1 + handing.handed_on) * prices.sns_chunks(work_bytes)
        + W * prices.sns_chunks(report_bytes)
        + R * prices.sns_chunks(reduce_bytes)
        + R
        + 1  # +1: S3 event
        + exchange.released * prices.sns_chunks(exchange.release_bytes)
    )

    # WorkLauncher: read the run (and its spend, with a budget), claim the iteration, publish Work (the n-th
    # message's batch is on the path)
    launch_s = p.handler_s + (2 + bool(counted)) * ddb + publishing(publish_batches(n, work_bytes))
    launcher_s = p.handler_s + (2 + bool(counted)) * ddb + publishing(work_batches)
    # the rule's round reads the slot's state before its steps and stores the new one after them; the residual
    # is read alongside the round and stored before the update
    slot_s = 2 * _transfer(1, slot_b, lat, p.s3_read_mb_s) if slot_b else 0.0
    residual_read, residual_write = (
        (_transfer(1, residual_b, lat, p.s3_read_mb_s), _transfer(1, residual_b, lat, p.s3_write_mb_s))
        if residual_b
        else (0.0, 0.0)
    )
    round_s = max(slot_s + streamed_s, residual_read)
    write_update = residual_write + _transfer(1, U, lat, p.s3_write_mb_s)
    # ddb: the Work's check; a round that outlasts the Worker's timeout goes on in fresh invocations
    worker_s = p.handler_s + ddb + read_s + round_s + write_update + pub + handing.seconds
    count_s = p.handler_s + lat + 2 * ddb  # lat: the WorkDone's check
    fire_s = count_s + ddb + pages * ddb + ddb + traffic.late_queries * ddb + publishing(reduce_batches)

    def reducer(weights: float, state: float) -> tuple[float, float, float]:
        """(read, compute, total) seconds of one reducer of a shard of this size."""
        elements = weights / 4
        parts = n * part * weights / shard_weights  # the participants' parts of a shard of this size
        read = traffic.table_reads * _transfer(n, 16 * n, lat, p.s3_read_mb_s, p.s3_parallel_reads) + _transfer(
            n + 1, parts + weights + state, lat, p.s3_read_mb_s, p.s3_parallel_reads
        )
        cpu = min(1.0, vcpus(mem["reducer"]))
        math_s = elements * (n * p.average_ns + p.optimizer_ns) * 1e-9 / cpu
        total = p.handler_s + ddb + read + math_s + _transfer(1, weights + state, lat, p.s3_write_mb_s) + pub
        return read, math_s, total

    reduce_read, reduce_math, reducer_s = reducer(shard_weights, shard_state)
    reducer_mean_s = reducer(mean_weights, mean_state)[2]
    share_s = step_s = 0.0
    if exchange.released:  # store the average, record + count + read the sums + claim, release; read back
        share_s = (
            _transfer(1, shard_weights, lat, p.s3_write_mb_s)
            + (3 + math.ceil(R / runstate.BATCH_READ)) * ddb
            + publishing(publish_batches(exchange.released, exchange.release_bytes))
        )
        step_s = (
            p.handler_s + ddb + _transfer(2, 2 * shard_weights + shard_state, lat, p.s3_read_mb_s, p.s3_parallel_reads)
        )
    # the check, the count, the list of the shards, the fire and the advance, the manifest's PUT
    merge_s = p.handler_s + lat + ddb + lat + 2 * ddb + lat
    merger_count_s = p.handler_s + lat + ddb

    stages = [
        Stage(
            name="model → WorkLauncher",
            function=None,
            seconds=p.s3_event_s + hop,
            detail="S3 event → SNS ModelUpdated → Lambda",
        ),
        Stage(
            name="WorkLauncher",
            function="work_launcher",
            seconds=launch_s,
            detail=f"run + claim (DynamoDB), Work to the {n}-th worker: {publish_batches(n, work_bytes)} of "
            f"{work_batches} PublishBatch, {p.sns_parallel_publishes:g} at a time",
        ),
        Stage(name="Work → Worker", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Worker",
            function="worker",
            seconds=worker_s,
            detail=f"read weights ({R} shards) {read_weights:.2f} s"
            + (
                f" and {data.gets_per_iteration / W:,.1f} data GETs {data.read_s:.2f} s (ahead of compute)"
                if data and data.gets_per_iteration
                else ""
            )
            + f", {w.training.algorithm}: compute "
            f"{traffic.compute_steps} × {local_batch} samples {compute_s:.2f} s"
            + (f" {step_in_words(steps.size, steps.per_step)}" if steps.per_step > 1 else "")
            + (f", slot state {slot_s:.2f} s" if slot_b else "")
            + (f", residual read {residual_read:.2f} s (alongside), written" if residual_b else "")
            + f", write update {write_update:.2f} s, WorkDone"
            + (
                f"; in {handing.invocations} invocations of {_handed(handing, steps.size, steps.per_step)}, handing on"
                f" {handing.seconds:.2f} s"
                if handing.handed_on
                else ""
            ),
        ),
        Stage(name="WorkDone → ReduceLauncher", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="ReduceLauncher (fires)",
            function="reduce_launcher",
            seconds=fire_s,
            detail=f"record + count, {pages} BatchGetItem, participants, "
            + (f"{traffic.late_queries} Query for late updates, " if traffic.late_queries else "")
            + f"fire, {reduce_batches} PublishBatch ({p.sns_parallel_publishes:g} at a time)",
        ),
        Stage(name="Reduce → Reducer", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Reducer",
            function="reducer",
            seconds=reducer_s,
            detail=(f"{n} part-table GETs, then " if traffic.table_reads else "")
            + f"{n + 1} GETs {reduce_read:.2f} s, average + optimizer {reduce_math:.2f} s, write shard",
        ),
        *(
            [
                Stage(
                    name="Norm exchange",
                    function="reducer",
                    seconds=share_s + hop + step_s,
                    detail=f"store average + sums of squares, release {exchange.released} shards (SNS → Lambda), "
                    "read average and shard back",
                )
            ]
            if exchange.released
            else []
        ),
        Stage(name="ReduceDone → Merger", function=None, seconds=hop, detail="SNS → Lambda"),
        Stage(
            name="Merger (merges)",
            function="merger",
            seconds=merge_s,
            detail="count, list the shards, advance, write the manifest (its S3 event launches the next iteration)",
        ),
    ]
    chain_s = sum(s.seconds for s in stages)
    floor_s = counter_units / quotas.dynamodb_partition_wu_s
    iteration_s = max(chain_s, floor_s)

    durations = {  # (invocations, billed seconds of each) per function
        "work_launcher": [(1, launcher_s)],
        "worker": [(W * handing.invocations, worker_s / handing.invocations)],
        "reduce_launcher": [(W - 1, count_s), (1, fire_s)],
        "reducer": [(R, reducer_mean_s + share_s), (exchange.released, step_s)],
        "merger": [(R - 1, merger_count_s), (1, merge_s)],
    }
    if counted:  # each invocation's addition to the spend, after its work (off the critical path)
        durations = {name: [(count, seconds + ddb) for count, seconds in runs] for name, runs in durations.items()}
    state_total = k * 4 * w.trainable_params
    data_bytes = round(data.bytes_per_iteration) if data else 0
    io = {  # (read, written) bytes: the critical invocation, then all of one iteration
        "work_launcher": (0, 0, 0, 0),
        "worker": (
            M + slot_b + residual_b + math.ceil(data_bytes / W) + handing.bytes_read // W,
            U + slot_b + residual_b + handing.bytes_written // W,
            W * (M + slot_b + residual_b) + data_bytes + handing.bytes_read,
            W * (U + slot_b + residual_b) + handing.bytes_written,
        ),
        "reduce_launcher": (0, 0, 0, 0),
        "reducer": (
            n * part + shard_weights + shard_state,
            shard_weights + shard_state,
            n * (U - updates.HEADER_SIZE) + M + state_total,
            M + state_total,
        ),
        "merger": (0, manifest_b, 0, manifest_b),
    }
    memory_needed = {
        "work_launcher": p.python_runtime_mb,
        "worker": steps.needed_mb,
        "reduce_launcher": p.python_runtime_mb + W * record_b / 1e6,
        "reducer": p.python_runtime_mb
        + (n * max(part, shard_weights) + 8 * shard_weights / 4 + 2 * (shard_weights + shard_state)) / 1e6,
        # the final merge also holds the optimizer's slots (in Keras and in the saved file) and a shard's state
        "merger": p.tf_runtime_mb + (p.merger_model_copies * M + 2 * state_total + shard_state) / 1e6,
    }
    critical = {
        "work_launcher": launcher_s,
        "worker": worker_s,
        "reduce_launcher": fire_s,
        "reducer": reducer_s,
        "merger": merge_s,
    }
    functions = []
    gb_seconds = 0.0
    for name in PIPELINE:
        gbs = sum(count * prices.gb_seconds(seconds, mem[name]) for count, seconds in durations[name])
        gb_seconds += gbs
        read, written, read_total, written_total = io[name]
        functions.append(
            FunctionFigures(
                function=name,
                invocations=sum(c for c, _ in durations[name]),
                memory_mb=mem[name],
                seconds=critical[name],
                gb_seconds=gbs,
                bytes_read=read,
                bytes_written=written,
                bytes_read_total=read_total,
                bytes_written_total=written_total,
                memory_needed_mb=memory_needed[name],
            )
        )
    dollars = price_table.cost(
        requests,
        read_units=read_units,
        write_units=write_units,
        gb_seconds=gb_seconds,
        invocations=invocations,
        publish_chunks={"sns:PublishBatch": sns_billed},
        log_bytes=invocations * p.log_bytes_per_invocation,
    )
    first = _first_iteration(w, p, price_table, M, F, local_batch, data)
    spreads = {"work": publishing(work_batches), "reduce": publishing(reduce_batches)}
    checks = _quotas(
        w,
        p,
        quotas,
        n,
        largest_reduce(w.run_spec),
        {**critical, "worker": worker_s / handing.invocations},  # each invocation's
        memory_needed,
        lambda memory_mb: micro_batching(w, p, traffic, memory_mb),
        spreads,
        reduce_read,
        read_weights,
        chain_s,
        floor_s,
        counter_units,
        data,
    )
    per_epoch = w.iterations_per_epoch
    minimum = minimum_chain(W, R, n, work_batches, reduce_batches, traffic, requests["s3:DeleteObjects"])
    minimum["s3:GetObject"] += data_gets  # the samples used are read however the pipeline runs
    return Plan(
        workload=w,
        participants=n,
        state_slots=k,
        requests_per_iteration=requests,
        minimum_requests_per_iteration=minimum,
        data=data,
        extra_calls=[*chain_extras(W, R, n, traffic, counted), *handing.calls],
        micro_batch=steps.size,
        micro_batches=steps.per_step,
        continuations=handing,
        read_units=read_units,
        write_units=write_units,
        sns_billed_publishes=sns_billed,
        stages=stages,
        functions=functions,
        chain_s=chain_s,
        floor_s=floor_s,
        iteration_s=iteration_s,
        epoch_s=None if per_epoch is None else per_epoch * iteration_s,
        run_s=w.iterations * iteration_s + first.extra_s,
        dollars_per_iteration=dollars,
        first_iteration=first,
        quotas=checks,
        parameters=_described(p),
    )


def workload_data(w: Workload, p: Parameters) -> DataTraffic | None:
    """The workers' data reads (``slsml.cost.datatraffic``); None without the samples and their bytes."""
    if w.samples is None or not w.sample_bytes:
        return None
    spec = w.training
    return data_traffic(
        spec.shuffle,
        w.samples,
        w.sample_bytes,
        w.global_batch,
        w.workers,
        spec.local_batches,
        spec.shuffle_block,
        w.memory_mb["worker"],
        w.cache_mb,
        w.shard_records,
        p.s3_request_s,
        p.s3_read_mb_s,
    )


def _first_iteration(
    w: Workload,
    p: Parameters,
    price_table: prices.PriceTable,
    M: int,
    F: int,
    local_batch: int,
    data: DataTraffic | None,
) -> FirstIteration:
    """Cold starts on the critical path and the reads only a cold container makes."""
    W, R = w.workers, w.reducers
    cold = {name: p.cold_start_image_s if name in IMAGE_FUNCTIONS else p.cold_start_zip_s for name in PIPELINE}
    load_model = F / (p.keras_mb_s * 1e6) / min(1.0, vcpus(w.memory_mb["worker"]))
    shards_each = 0.0
    data_s = 0.0
    notes = []
    if data is not None and data.cached:  # whole shards, once
        per_shard = min(data.shard_records, w.samples or data.shard_records)
        shards = math.ceil(data.samples / per_shard)
        shards_each = shards * (1 - (1 - 1 / shards) ** local_batch)  # distinct shards of a random slice
        shard_bytes = per_shard * data.sample_bytes
        data_s = shards_each * (p.s3_request_s + shard_bytes / (p.s3_read_mb_s * 1e6))
        notes.append(f"each worker reads {shards_each:.1f} dataset shards of {shard_bytes / 1e6:.0f} MB")
    elif data is not None:
        notes.append("the workers read the samples they use, as every iteration does (past their cache)")
    elif w.samples is not None:
        notes.append(
            f"each worker reads dataset shards of up to {DEFAULT_SHARD_MB:g} MB (their number unknown: --sample-bytes)"
        )
    # a cold worker reads run.json, the dataset's manifest and the model file, which holds the weights entering the
    # first iteration: not the manifest and the R shards a steady worker reads them from
    skipped = 1 + R
    worker_extra = (
        3 * p.s3_request_s
        - math.ceil(R / p.s3_parallel_reads) * p.s3_request_s
        + (F - M) / (p.s3_read_mb_s * 1e6)
        + load_model
        + data_s
    )
    # the merging Merger builds the run's metrics once, to turn the iteration's train metrics into results: it reads
    # the model file, the dataset's manifest and a test shard (two samples), and loads the model
    merger_extra = 3 * p.s3_request_s + F / (p.s3_read_mb_s * 1e6) + load_model
    extra_s = sum(cold.values()) + worker_extra + merger_extra
    gets = W * (3 + math.ceil(shards_each) - skipped) + W + R + R + 1  # workers; run.json of every other container
    gets += 3  # the merging Merger's model file, dataset manifest and test shard
    extra = {"s3:GetObject": gets}
    memory = w.memory_mb
    init_gbs = (
        prices.gb_seconds(cold["work_launcher"], memory["work_launcher"])
        + W * prices.gb_seconds(cold["worker"] + worker_extra, memory["worker"])
        + W * prices.gb_seconds(cold["reduce_launcher"], memory["reduce_launcher"])
        + R * prices.gb_seconds(cold["reducer"], memory["reducer"])
        + R * prices.gb_seconds(cold["merger"], memory["merger"])
        + prices.gb_seconds(merger_extra, memory["merger"])
    )
    dollars = sum(price_table.cost(extra, gb_seconds=init_gbs).values())
    notes.insert(0, "cold starts on the path: " + ", ".join(f"{name} {s:g} s" for name, s in cold.items()))
    notes.append(
        "every container reads run.json; the workers read the model file and the dataset's manifest, not the shards;"
        " the merging Merger reads the model file, the dataset's manifest and a test shard to build the run's metrics"
    )
    return FirstIteration(extra_s=extra_s, extra_requests=extra, extra_dollars=dollars, detail="; ".join(notes))


def _quotas(
    w: Workload,
    p: Parameters,
    q: Quotas,
    n: int,
    largest: tuple[int, int],
    critical: dict[str, float],
    memory_needed: dict[str, float],
    worker_steps: Callable[[int], MicroBatches],
    spreads: dict[str, float],
    reduce_read: float,
    weights_read: float,
    chain_s: float,
    floor_s: float,
    counter_units: int,
    data: DataTraffic | None = None,
) -> list[QuotaCheck]:
    W, R = w.workers, w.reducers
    checks: list[QuotaCheck] = []

    def add(name: str, value: float, limit: float, unit: str, detail: str, hard: bool = False) -> None:
        checks.append(
            QuotaCheck(name=name, value=value, limit=limit, unit=unit, ok=value <= limit, hard=hard, detail=detail)
        )

    # Workers run while the WorkLauncher still publishes (when a worker outlasts the launch), reducers likewise.
    workers_in_flight = (
        W if critical["worker"] >= spreads["work"] else math.ceil(W * critical["worker"] / spreads["work"])
    )
    stage = (
        f"{workers_in_flight} workers in flight while the WorkLauncher publishes (+1)"
        if workers_in_flight >= R
        else f"{R} reducers in flight while the ReduceLauncher publishes (+1)"
    )
    add(
        "Lambda concurrency",
        max(workers_in_flight, R) + 1,
        q.lambda_concurrency,
        "executions",
        f"{stage}; throttled invocations wait and retry",
    )
    add(
        "Lambda burst (first iteration)",
        W * 10 / max(10.0, spreads["work"]),
        q.lambda_burst_per_10s,
        "new workers / 10 s",
        f"{W} cold workers start within {spreads['work']:.1f} s",
    )
    for name in ("worker", "reducer", "merger"):
        need, have = memory_needed[name], w.memory_mb[name]
        detail = f"{name} needs ~{need:,.0f} MB and has {have:,} MB"
        if name == "worker":
            steps = worker_steps(have)
            detail += f" for a step {step_in_words(steps.size, steps.per_step)}" + (
                "" if steps.size <= steps.fitting else f" ({steps.fitting} fit)" if steps.fitting else " (not one fits)"
            )
        if need > have:  # the least memory that fits (a worker's need grows with it: its warm cache is a share)
            give = next(
                (
                    mb
                    for mb in MEMORY_CHOICES_MB
                    if (worker_steps(mb).needed_mb if name == "worker" else need) <= mb <= q.lambda_memory_mb
                ),
                None,
            )
            detail += f": over by {need - have:,.0f} MB" + (
                f", beyond Lambda's {q.lambda_memory_mb:,} MB: {_RELIEF[name]}"
                if give is None
                else f" (--memory {name}={give})"
            )
        add(f"memory: {name}", need, min(have, q.lambda_memory_mb), "MB", detail, hard=True)
    for name in ("worker", "reducer", "merger"):
        timeout = min(w.timeout_s[name], q.lambda_timeout_s)
        seconds = critical[name]
        add(
            f"duration: {name}",
            seconds,
            timeout,
            "s",
            f"{name} runs {seconds:,.1f} s of its {timeout} s timeout"
            + (
                ""
                if seconds <= timeout
                else f": over by {seconds - timeout:,.1f} s"
                + (
                    f", beyond Lambda's {q.lambda_timeout_s} s"
                    if seconds > q.lambda_timeout_s
                    else " (raise the deployment's functions.<name>.timeout_s)"
                )
            ),
        )
    message_limit = min(q.sns_message_bytes, MAX_MESSAGE_BYTES)
    participants, largest_bytes = largest
    add(
        "Reduce message size",
        largest_bytes,
        message_limit,
        "B",
        f"the largest Reduce message lists {listed(w.run_spec, participants)}: {largest_bytes:,} B; SNS allows"
        f" {q.sns_message_bytes:,} B, slsml's functions take {MAX_MESSAGE_BYTES:,} B"
        + (f": over by {largest_bytes - message_limit:,} B" if largest_bytes > message_limit else ""),
        hard=True,
    )
    item = n * p.participant_bytes
    add(
        "DynamoDB item size",
        item,
        q.dynamodb_item_bytes,
        "B",
        f"the participants item of {n} workers is ~{item:,.0f} B"
        + (
            f": over DynamoDB's {q.dynamodb_item_bytes:,} B by {item - q.dynamodb_item_bytes:,.0f} B"
            if item > q.dynamodb_item_bytes
            else ""
        ),
        hard=True,
    )
    rate = counter_units / max(chain_s, 1e-9)
    add(
        "DynamoDB partition writes",
        rate,
        q.dynamodb_partition_wu_s,
        "WU/s",
        f"the iteration counter item takes {counter_units} write units an iteration (W + R + 3 writes)"
        + (
            f": at {q.dynamodb_partition_wu_s:,} WU/s an iteration lasts at least {floor_s:.2f} s, "
            f"{floor_s - chain_s:.2f} s over the {chain_s:.2f} s chain"
            if floor_s > chain_s
            else ""
        ),
    )
    # each worker's update and each shard lie under a prefix of their own (slsml.spec.keys), which S3 partitions
    # apart as their rates call for it
    update_prefix = keys.update("<run>", 0, 0).rsplit("/", 1)[0].replace("000000", "<i>").replace("00000", "<w>") + "/"
    shard_prefix = keys.shard("<run>", 0, 0).rsplit("/", 1)[0].replace("000000", "<i>").replace("0000", "<r>") + "/"
    gets = {
        f"{update_prefix}: the {R} reducers' ranged reads of a worker's update": R
        / max(1.0, spreads["reduce"] + reduce_read),
        f"{shard_prefix}: the {W} workers' ranged reads of a shard, and its reducer's": (W + 1)
        / max(1.0, spreads["work"] + weights_read),
    }
    puts = {
        f"{update_prefix}: a worker's update": 1 / max(1.0, spreads["work"]),
        f"{shard_prefix}: a reducer's shard": 1 / max(1.0, spreads["reduce"]),
    }
    hit = (
        f"each worker's update and each shard under a prefix of its own, {update_prefix} and {shard_prefix}, which"
        " S3 partitions apart as their rates call for it (until it does, a busy prefix's 503 SlowDown answers retry)"
    )
    for kind, rates, limit in (("GET", gets, q.s3_get_per_s), ("PUT", puts, q.s3_put_per_s)):
        busiest, value = max(rates.items(), key=lambda item: item[1])
        over = f": over by {value - limit:,.0f}/s, S3 answers 503 SlowDown and the requests retry"
        add(
            f"S3 {kind} rate",
            value,
            limit,
            f"{kind}/s",
            f"busiest {busiest}" + (f"; {hit}" if kind == "GET" else "") + (over if value > limit else ""),
        )
    if data is not None and data.burst_gets:  # the workers read their samples together, as they start
        prefix = keys.dataset_shard("<name>", "train", 0).rsplit("/", 1)[0].replace("00000", "<k>") + "/"
        value = data.busiest_gets / max(1.0, spreads["work"] + data.burst_s)
        add(
            "S3 GET rate: data",
            value,
            q.s3_get_per_s,
            "GET/s",
            f"busiest {prefix}: {data.busiest_gets:,.0f} of the {W} workers' {data.burst_gets:,.0f} GETs as they"
            f" start, spread over the training split's {data.prefixes:,} shards, each under a prefix of its own"
            + (
                f": over by {value - q.s3_get_per_s:,.0f}/s, S3 answers 503 SlowDown and the requests retry (the"
                " block order reads a block of samples in one GET; smaller shards spread them over more prefixes)"
                if value > q.s3_get_per_s
                else ""
            ),
        )
    add("zip package", p.zip_layer_mb, q.zip_mb, "MB", "numpy layer + slsml, unzipped", hard=True)
    add("container image", p.image_mb, q.image_mb, "MB", "TensorFlow image of the worker and merger", hard=True)
    return checks


STATIC_QUOTAS = ("zip package", "container image")  # the deployment's, whatever the configuration
MEMORY_QUOTAS = ("memory: worker", "memory: reducer", "memory: merger")  # answered, naming the memory to give


_RELIEF = {
    "worker": "a smaller model (its weights, or one sample's layer outputs) or a smaller --micro-batch",
    "reducer": "more reducers",
    "merger": "a smaller model",
}


def parameter_facts(name: str) -> dict[str, Any]:
    """A parameter's unit and source (its field's ``json_schema_extra``, as ``_param`` gives it)."""
    extra = Parameters.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _described(p: Parameters) -> dict[str, dict[str, Any]]:
    out = {}
    for name, field in Parameters.model_fields.items():
        extra = parameter_facts(name)
        out[name] = {
            "value": getattr(p, name),
            "unit": extra.get("unit", ""),
            "what": field.description,
            "source": extra.get("source", ""),
        }
    return out


def with_origin(plan: Plan, origin: Mapping[str, str]) -> Plan:
    """The plan with overridden parameters' sources naming where their values came from."""
    for name, where in origin.items():
        plan.parameters[name]["source"] = where
    return plan


def binding_sentence(plan: Plan) -> str:
    q = plan.binding
    share = q.utilization
    head = f"{q.name} binds first: {q.value:,.4g} of {q.limit:,.4g} {q.unit} ({share:.0%})"
    if share > 1:
        return f"{head}, over by {q.value - q.limit:,.4g} {q.unit}. {q.detail}"
    return f"{head}: {1 / share:.2g}× headroom. {q.detail}"


def minimum_sentence(plan: Plan) -> str:
    total, minimum = sum(plan.requests_per_iteration.values()), sum(plan.minimum_requests_per_iteration.values())
    return f"requests: {total:,} per iteration, {minimum:,} in the minimum chain ({plan.requests_ratio:.2f}×)"


# ---- choices -----------------------------------------------------------------------------------


class Choice(BaseModel):
    reducers: int
    worker_memory_mb: int
    reducer_memory_mb: int
    iteration_s: float
    iteration_dollars: float
    epoch_dollars: float | None


class Recommendation(BaseModel):
    fastest: Choice | None = Field(description="least time per iteration; None: nothing fits Lambda's limits")
    cheapest: Choice | None = Field(description="fewest dollars per iteration")
    over: list[str] = Field(description="throughput quotas the fastest choice still exceeds (none fits them all)")
    as_workers_grow: str = Field(description="the quotas W reaches as it grows, R and the batch fixed")


def _choice(plan: Plan) -> Choice:
    w = plan.workload
    return Choice(
        reducers=w.reducers,
        worker_memory_mb=w.memory_mb["worker"],
        reducer_memory_mb=w.memory_mb["reducer"],
        iteration_s=plan.iteration_s,
        iteration_dollars=plan.iteration_dollars,
        epoch_dollars=plan.epoch_dollars,
    )


def _rank(plan: Plan, objective: float) -> tuple[int, int, float]:
    """Within Lambda's hard limits first, then within the throughput quotas, then by the objective."""
    return (sum(q.hard for q in plan.violations), sum(not q.hard for q in plan.violations), objective)


def recommend(
    workload: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: prices.PriceTable,
    reducers_fixed: bool = False,
) -> Recommendation:
    """The fastest and the cheapest R and worker and reducer memory for the workload's W and model."""
    reducers = (
        [workload.reducers]
        if reducers_fixed
        else sorted({r for r in (*REDUCER_CHOICES, workload.reducers) if r <= min(256, workload.params)})
    )
    plans = [
        predict(_with_memory(workload, worker=wm, reducer=rm).at(reducers=r), parameters, quotas, price_table)
        for r in reducers
        for wm in MEMORY_CHOICES_MB
        for rm in MEMORY_CHOICES_MB
    ]
    fastest = min(plans, key=lambda plan: _rank(plan, plan.iteration_s + 1e-9 * plan.iteration_dollars))
    cheapest = min(plans, key=lambda plan: _rank(plan, plan.iteration_dollars + 1e-9 * plan.iteration_s))

    def fits(plan: Plan) -> Choice | None:
        return None if any(q.hard for q in plan.violations) else _choice(plan)

    return Recommendation(
        fastest=fits(fastest),
        cheapest=fits(cheapest),
        over=[q.name for q in fastest.violations],
        as_workers_grow=as_workers_grow(workload, parameters, quotas, price_table),
    )


FEW_SAMPLES = 16  # a worker's share of the batch below which its compute hardly pays its round trip
LATENCY_BOUND = 0.5  # the share of an iteration in hops between functions past which it is latency-bound
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
            f"{plan.iteration_s:.2f} s) is S3 event and SNS delivery between functions, whatever the"
            " workers compute; more work per round (a larger batch, --local-steps) spreads it"
        )
    if handing := continuation_sentence(plan):
        warnings.append(handing)
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
        recommendations=_advice(plan, recommendation),
        budget=None if budget is None else budget_sentence,
    )


def continuation_sentence(plan: Plan) -> str | None:
    """What handing each round on to fresh invocations adds (None: every round fits one Worker invocation)."""
    handing, w = plan.continuations, plan.workload
    if not handing.handed_on:
        return None
    requests = sum(call.count for call in handing.calls)
    sentence = (
        f"each worker's round outlasts the Worker's {handing.timeout_s:g} s timeout: it goes on in"
        f" {handing.invocations} invocations of {_handed(handing, plan.micro_batch, plan.micro_batches)}, each handing"
        f" on {handing.progress_bytes / 1e6:,.1f} MB of progress; that adds {requests:,} requests,"
        f" {(handing.bytes_read + handing.bytes_written) / 1e6:,.1f} MB and {handing.seconds:,.2f} s an iteration"
    )
    heartbeat = w.training.heartbeat_s
    if plan.iteration_s > heartbeat:
        sentence += f"; raise --heartbeat above {math.ceil(plan.iteration_s)} s (it is {heartbeat} s)"
    return sentence


class VmComparison(BaseModel):
    """The same samples trained on one machine, at its throughput and hourly price (``--compare-vm``)."""

    machine: str
    samples_per_s: float = Field(gt=0, description="training throughput of the machine on this model")
    dollars_per_hour: float = Field(gt=0, description="its on-demand price")
    source: str = Field(description="where the two figures come from")
    samples: int = Field(description="what is compared: an epoch's samples, else the run's")
    seconds: float
    dollars: float
    lambda_seconds: float
    lambda_dollars: float
    sentence: str


def compare_vm(
    plan: Plan, machine: str, samples_per_s: float, dollars_per_hour: float, source: str = "given (--compare-vm)"
) -> VmComparison:
    """The plan's epoch (or run, without --samples) against one machine of ``samples_per_s`` and
    ``dollars_per_hour``: billed by the second for the time the samples take."""
    w = plan.workload
    if plan.epoch_s is not None and plan.epoch_dollars is not None and w.samples is not None:
        what, samples, lambda_s, lambda_dollars = "an epoch", w.samples, plan.epoch_s, plan.epoch_dollars
    else:
        what, samples, lambda_s, lambda_dollars = (
            "the run",
            w.iterations * w.global_batch,
            plan.run_s,
            plan.run_dollars,
        )
    seconds = samples / samples_per_s
    dollars = seconds / 3600 * dollars_per_hour
    time, money = lambda_s / seconds, lambda_dollars / dollars
    sentence = (
        f"{what} on {machine} ({samples_per_s:,.4g} samples/s, ${dollars_per_hour:,.4g}/h; {source}): "
        f"{seconds:,.0f} s and ${dollars:,.4g}; slsml takes {time:.2g}× its time for {money:.2g}× its dollars"
    )
    return VmComparison(
        machine=machine,
        samples_per_s=samples_per_s,
        dollars_per_hour=dollars_per_hour,
        source=source,
        samples=samples,
        seconds=seconds,
        dollars=dollars,
        lambda_seconds=lambda_s,
        lambda_dollars=lambda_dollars,
        sentence=sentence,
    )


def _advice(plan: Plan, recommendation: Recommendation) -> list[str]:
    """Each recommended choice against the asked one: what dominates, what trades time for dollars, or that the
    asked one is already the best of its kind."""
    w, asked = plan.workload, _choice(plan)
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
    return advice


def _times(ratio: float, what: str) -> str:
    return f"{what} unchanged" if abs(ratio - 1) <= SAME else f"{ratio:.3g}× {what}"


def fastest_reducers(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> int:
    """The R of least iteration time for the workload's W and memory."""
    plans = [
        predict(workload.at(reducers=r), parameters, quotas, price_table)
        for r in REDUCER_CHOICES
        if r <= workload.params
    ]
    return min(plans, key=lambda plan: _rank(plan, plan.iteration_s)).workload.reducers


def _with_memory(workload: Workload, **sizes: int) -> Workload:
    return workload.at(memory_mb={**workload.memory_mb, **sizes})


def quota_changes(
    workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable, top: int | None = None
) -> list[tuple[int, str, bool]]:
    """(W, quota, exceeded from this W on) for each quota that changes side as W grows from 1 to ``top``,
    R, batch and memory fixed."""
    top = top or min(quotas.lambda_concurrency, workload.global_batch)

    @cache
    def broken(workers: int) -> frozenset[str]:
        plan = predict(workload.at(workers=workers), parameters, quotas, price_table)
        return frozenset(q.name for q in plan.violations)

    changes = []
    previous = 1
    grid = sorted({min(top, max(1, round(1.05**i))) for i in range(400)} | {top})
    for workers in grid[1:]:
        for name in sorted(broken(previous) ^ broken(workers)):
            low, high = previous, workers  # bisect to the first W on the new side
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (low, middle) if (name in broken(middle)) != (name in broken(previous)) else (middle, high)
            changes.append((high, name, name in broken(workers)))
        previous = workers
    return sorted(changes)


def as_workers_grow(workload: Workload, parameters: Parameters, quotas: Quotas, price_table: prices.PriceTable) -> str:
    """The quotas' changes as W grows, in words."""
    top = min(quotas.lambda_concurrency, workload.global_batch)
    head = f"as W grows from 1 to {top} (R = {workload.reducers}, batch {workload.global_batch})"
    initially = sorted(q.name for q in predict(workload.at(workers=1), parameters, quotas, price_table).violations)
    parts = [f"over at W = 1: {', '.join(initially)}"] if initially else []
    for workers, name, exceeded in quota_changes(workload, parameters, quotas, price_table, top):
        parts.append(f"{name} {'exceeded' if exceeded else 'fits'} from W = {workers}")
    return f"{head}: " + ("; ".join(parts) if parts else "no quota is reached")


class SweepPoint(BaseModel):
    workers: int
    reducers: int
    micro_batch: int = Field(description="the most samples a worker computes at once (the plan's)")
    micro_batches: int = Field(description="micro-batches of a worker's step")
    invocations: int = Field(description="Worker invocations a round takes (more than 1: handed on)")
    iteration_s: float
    epoch_s: float
    epoch_dollars: float
    violations: list[str]


def sweep(
    workload: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: prices.PriceTable,
    reducers_fixed: bool,
    workers: Iterable[int] = SWEEP_WORKERS,
) -> list[SweepPoint]:
    """Time and dollars per epoch against W (batch, memory fixed; R fixed or the fastest at each W), each W as it
    would run: its workers' shares in micro-batches that fit, its rounds handed on where they outlast the timeout."""
    if workload.iterations_per_epoch is None:
        raise BadInputError("a sweep prices epochs: give --epochs and --samples")
    points = []
    for count in workers:
        if count > min(workload.global_batch, quotas.lambda_concurrency):
            continue
        at = workload.at(workers=count)
        if not reducers_fixed:
            at = at.at(reducers=fastest_reducers(at, parameters, quotas, price_table))
        plan = predict(at, parameters, quotas, price_table)
        points.append(
            SweepPoint(
                workers=count,
                reducers=at.reducers,
                micro_batch=plan.micro_batch,
                micro_batches=plan.micro_batches,
                invocations=plan.continuations.invocations,
                iteration_s=plan.iteration_s,
                epoch_s=plan.epoch_s,
                epoch_dollars=plan.epoch_dollars,
                violations=[q.name for q in plan.violations],
            )
        )
    return points
