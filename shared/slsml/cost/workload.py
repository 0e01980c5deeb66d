"""What the cost model plans: the model's figures, the pipeline's shape and the run's length (``Workload``), and the
functions' memory and timeouts of the deployment planned for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slsml.cost.calibration import Precision
from slsml.data.manifest import DatasetManifest
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits
from slsml.spec.samples import epoch_batches
from slsml.training import optimizers

PIPELINE = ("work_launcher", "worker", "reduce_launcher", "reducer", "merger")
IMAGE_FUNCTIONS = ("worker", "merger")  # container images with TensorFlow; the others are zip + layer
MEMORY_CHOICES_MB = (512, 1024, 1769, 2048, 3008, 3538, 4096, 5307, 7076, 8845, 10240)


class Accelerator(BaseModel):
    """The GPU of a GPU worker's execution environment (Lambda Managed Instances): its memory, the instance type it
    runs on, its card's peak and the fraction of it a training step achieves (``slsml.cost.gpuworker``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gib: int = Field(gt=0, description="GPU memory per execution environment (functions.worker.accelerator_gib)")
    instance: str = Field(description="the EC2 instance type, a key of the price table's gpu_instances")
    precision: Precision
    peak_tflops: float = Field(gt=0, description="the card's published peak in this precision (cards.DATASHEETS)")
    fraction: float = Field(gt=0, description="the fraction of that peak a whole card achieves training")
    environment_fraction: float = Field(
        gt=0, description="one execution environment's: the card's × its share of the memory, at most its own measure"
    )
    source: str = Field(description="where the fraction comes from")


class Embedding(BaseModel):
    """An embedding table of the model (``keras.layers.Embedding``): a round's update touches the rows its samples
    look up, and ``compress sparse`` sends those alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int = Field(gt=0, description="the table's rows (input_dim)")
    width: int = Field(gt=0, description="the entries of a row (output_dim)")
    lookups: int = Field(gt=0, description="rows one sample looks up (its input's entries)")

    def touched(self, samples: int) -> float:
        """Rows a batch of ``samples`` is expected to touch, its lookups spread uniformly over the rows (the
        occupancy of ``rows`` bins by ``samples·lookups`` balls; a skewed distribution touches fewer)."""
        return self.rows * (1 - (1 - 1 / self.rows) ** (samples * self.lookups))


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
    train_flops_per_sample: float | None = Field(
        default=None,
        gt=0,
        description="one sample's training step, forward and backward (slsml.cost.flops); None: estimated from the"
        " weights (Parameters.train_flops_per_param_sample)",
    )
    embeddings: tuple[Embedding, ...] = Field(default=(), description="the model's embedding tables")
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
    accelerator: Accelerator | None = Field(default=None, description="a GPU worker's GPU; None: a CPU worker")

    @property
    def worker_kind(self) -> str:
        """The kind of its workers (``slsml.cost.workers``): gpu with an accelerator, else cpu."""
        return "cpu" if self.accelerator is None else "gpu"

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
        """Iterations of an epoch of ``samples`` as a run counts them (``epoch_batches``; None without them)."""
        return None if self.samples is None else max(1, epoch_batches(self.samples, self.global_batch, self.workers))

    def at(self, **changes: Any) -> Workload:
        """The workload with ``changes``."""
        return self.model_copy(update=changes)


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
    """The workload of the run ``spec`` of a model of these ``figures`` (``from_keras``, ``from_params``; under ASP an
    iteration is one worker's update: the requests, bytes and time of one update alone, their W overlapping): on the
    dataset of ``manifest`` (its samples, their bytes and its shards), else of ``samples``; with the workers'
    ``cache_mb``, the functions' ``memory`` (default: a default deployment's) and the timeouts of the deployment
    whose run ``limits`` are given (``function_timeouts``)."""
    figures = dict(figures)
    if manifest is not None:  # the dataset's own figures
        figures.update(sample_bytes=manifest.record_bytes, shard_records=manifest.shard_records)
        samples = manifest.train.count
    if spec.optimizer is not None:
        figures["optimizer"] = spec.optimizer
    workers, batch = spec.initial_workers, spec.global_batch
    if spec.asynchronous:  # ASP: an iteration is one worker's update, on its slice of a global batch, applied alone
        workers, batch = 1, math.ceil(batch / workers)
    return Workload(
        **figures,
        training=spec,
        workers=workers,
        reducers=spec.reducers,
        global_batch=batch,
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


def with_memory(workload: Workload, **sizes: int) -> Workload:
    """The workload with these functions' memory (function=MB)."""
    return workload.at(memory_mb={**workload.memory_mb, **sizes})
