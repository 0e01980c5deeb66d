"""How many samples a worker computes at once: its micro-batch, the most samples whose training step fits the
function's memory beside what the worker holds anyway. One estimate serves the worker, which sizes its
micro-batches with it, the run's start, which refuses a model of which not even one sample fits, and the plan.

A step's memory beyond the runtime grows with its samples by what their layer outputs take, kept for the backward
pass (``sample_bytes``: every layer's output, float32). Measured on ResNet-50 at 96×96 (TensorFlow 2.21, peak
resident set of one step), a sample took 16-22 MB where its layer outputs count 27 MB: the count bounds it from
above. What the worker holds besides: the TensorFlow runtime, model-sized buffers (the gradient, the flat and
encoded update, the weights read), the float64 sum of a step's micro-batches where there are several, and its warm
cache (the model and its weights, dataset shards: ``slsml.aws.cache``, a share of the memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from slsml.spec.config import RunConfig
from slsml.spec.errors import RunFailed
from slsml.training import feedback

TF_RUNTIME_MB = 584.0  # resident set after importing TensorFlow 2.21, measured
# model-sized float32 buffers of a step: the gradient, the flat and encoded update, the weights read (the model's own
# weights are the warm cache's: its trainer is an entry of it)
MODEL_COPIES = 4.0
SUM_COPIES = 2.0  # a step of several micro-batches: their float64 sum, twice a float32 model
# the sum as stored or read back (a round handed on): the archive's bytes beside it, while no micro-batch computes
ARCHIVE_COPIES = 2.0


def sample_bytes(model: Any) -> int:
    """What one sample adds to a training step of ``model`` (a Keras model): its layer outputs, float32; 0 where
    they are not known (a subclassed model's layers have no symbolic outputs)."""
    total = 0
    for layer in model.layers:
        try:
            output = layer.output
        except (AttributeError, ValueError):
            return 0
        outputs = output if isinstance(output, list | tuple) else [output]
        total += sum(math.prod(d or 1 for d in o.shape[1:]) for o in outputs)
    return 4 * total


@dataclass(frozen=True)
class WorkerMemory:
    """A worker's memory (MB, as the plan counts them: 10⁶ bytes) and what a step of its model takes of it."""

    memory_mb: float  # the function's
    cache_mb: float  # its warm cache's bound
    model_bytes: float  # the model's float32 weights
    sample_bytes: float  # what one sample adds to a step (``sample_bytes``)
    other_bytes: float = 0.0  # what the run's update rule keeps besides (a slot's state, a residual)

    def needed_mb(self, samples: int, micro_batches: int = 1) -> float:
        """The memory a step of ``samples`` at once takes, in a round of ``micro_batches`` per step, the cache full:
        with several, their float64 sum beside it, and the sum's archive in its place while the round is handed on."""
        held, step = MODEL_COPIES * self.model_bytes + self.other_bytes, samples * self.sample_bytes
        if micro_batches > 1:
            held += SUM_COPIES * self.model_bytes
            step = max(step, ARCHIVE_COPIES * self.model_bytes)
        return TF_RUNTIME_MB + self.cache_mb + (held + step) / 1e6

    def micro_batch(self) -> int:
        """The most samples a step of several micro-batches fits (0: not one)."""
        held = (MODEL_COPIES + SUM_COPIES) * self.model_bytes + self.other_bytes
        free = (self.memory_mb - TF_RUNTIME_MB - self.cache_mb) * 1e6 - held
        if free < ARCHIVE_COPIES * self.model_bytes:
            return 0
        return math.floor(free / self.sample_bytes) if self.sample_bytes else 2**31

    def micro_batches(self, samples: int, micro_batch: int | None = None) -> int:
        """Micro-batches of a step of ``samples`` with micro-batches of ``micro_batch`` (None: the most that fit)."""
        size = micro_batch or self.micro_batch()
        return -(-samples // max(1, size))

    def refusal(self) -> str | None:
        """Why not one sample fits (None: one does)."""
        if self.micro_batch() >= 1:
            return None
        buffers = (MODEL_COPIES + SUM_COPIES) * self.model_bytes / 1e6
        return (
            f"one sample's training step needs ~{self.needed_mb(1, micro_batches=2):,.0f} MB (the runtime"
            f" {TF_RUNTIME_MB:.0f} MB, the warm cache {self.cache_mb:,.0f} MB, the model's buffers {buffers:,.0f} MB,"
            f" a sample's layer outputs {self.sample_bytes / 1e6:,.1f} MB or, handing a round on, the archive of the"
            f" micro-batches' sum {ARCHIVE_COPIES * self.model_bytes / 1e6:,.0f} MB) and the worker has"
            f" {self.memory_mb:,.0f} MB: give the worker function more memory (a stack's functions.worker.memory_mb,"
            " up to 10240; --memory worker=MB locally)"
        )


def of_run(config: RunConfig, memory_mb: float, cache_mb: float, slot_bytes: int) -> WorkerMemory:
    """The memory of a worker of ``memory_mb`` with a warm cache of ``cache_mb`` training the run of ``config``,
    whose worker slots keep ``slot_bytes`` between rounds."""
    size = config.plan.size
    residual = feedback.residual_bytes(size) if config.training.compression.lossy else 0
    return WorkerMemory(memory_mb, cache_mb, 4 * size, config.sample_bytes, 2 * slot_bytes + 2 * residual)


def micro_batch(config: RunConfig, memory_mb: float, cache_mb: float, slot_bytes: int) -> int:
    """The run's micro-batch on a worker of ``memory_mb`` with a warm cache of ``cache_mb`` (``of_run``): the run's
    own (``micro_batch``), else the most samples that fit (a run of no per-sample figure: its shares whole).
    RunFailed, naming the memory needed, where not one sample fits."""
    if config.training.micro_batch is not None:
        return config.training.micro_batch
    if not config.sample_bytes:
        return config.training.global_batch
    memory = of_run(config, memory_mb, cache_mb, slot_bytes)
    refusal = memory.refusal()
    if refusal is not None:
        raise RunFailed(refusal)
    return memory.micro_batch()
