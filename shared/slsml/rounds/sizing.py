"""How many samples a worker computes at once: its micro-batch, the most samples whose training step fits the
function's memory beside what the worker holds anyway. One estimate serves the worker, which sizes its
micro-batches with it, the run's start, which refuses a model of which not even one sample fits, and the plan.

A step's memory beyond the runtime grows with its samples (``sample_bytes``): every layer's output, kept for the
backward pass, the gradients beside them at the backward pass's peak (of the largest output, of its layer's input, a
fused activation's input), and the sample's input as read, read ahead and as a tensor. What the worker holds besides:
the TensorFlow runtime, model-sized buffers (the gradient, the flat and encoded update, the weights read), the
float64 sum of a step's micro-batches where there are several, and its warm cache at its bound (the model and its
weights, dataset shards: ``slsml.aws.cache``, a share of the memory). All in Lambda's MB (2²⁰ bytes), as a
function's memory and the warm cache's bound are given.

Measured (TensorFlow 2.21, Keras 3.15; peak resident set of a step, ``slsml bench micro-batches``): the imports of a
TensorFlow function take 722 MB and a traced step's graph 23 more; a one-convolution model on 32×32 inputs took
227 KB a sample where its layer outputs count 66 KB (the gradients and the input, which layer outputs alone leave
out: the larger the share of one layer in a model, the shorter the outputs fall); ResNet-50 at 64×64 took 7.5-11 MB
a sample where its outputs count 12.2 MB, and its step in micro-batches peaked 3.3-3.7 model-sized buffers above
one pass (the bench's one pass holds two: gradient and flat update). Counted with the runtime of an import alone
(584, as 10⁶-byte MB) and the outputs alone, 29 samples of it were taken to fit a 3,008 MB worker beside its
1,504 MB cache, and their step peaked at 1,635 MB: with the cache full, 41 MB over.

A GPU worker (an execution environment with ``accelerator_gib`` of a GPU's memory) keeps a step's layer outputs on
the GPU, not in the function's memory: its micro-batch is the most samples whose step fits the accelerator memory
(``AcceleratorMemory``); its function's memory holds the rest, the runtime, the warm cache and the model's buffers,
as a CPU worker's does (``micro_batch`` refuses a run where they do not fit). Measured on ResNet-50 at 224×224
(``slsml bench gpu``, docs/benchmarks.md#gpu: device memory peaks of 5.06 and 19.4 GiB at 64 and 256 samples in
float32, 2.60 and 9.49 GiB in mixed_bfloat16), a sample took 0.54 of its float32 layer outputs' count on the device
in float32 and 0.26 in a 16-bit policy, beside 2.9-3.2 model-sized buffers (the weights, their gradient, the
optimizer's work)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from slsml.spec.config import RunConfig
from slsml.spec.errors import RunFailed
from slsml.training import feedback

MB = 2**20  # Lambda's MB: a function's memory_mb and the warm cache's bound are this many bytes
# a TensorFlow function's resident set before its model: its imports (TensorFlow 2.21, Keras 3.15, boto3, slsml's
# pipeline) and the graph of a traced training step (23 MB for a one-layer model), measured
TF_IMPORTS_MB = 722.0
TF_RUNTIME_MB = TF_IMPORTS_MB + 23.0
# model-sized float32 buffers of a step: the gradient, the flat and encoded update, the weights read (the model's own
# weights are the warm cache's: its trainer is an entry of it)
MODEL_COPIES = 4.0
SUM_COPIES = 2.0  # a step of several micro-batches: their float64 sum, twice a float32 model
# stale_weights: the read of the next round's model under way beside the step, its shards' bytes and its vector
# (``slsml.rounds.ahead``; the models it keeps are the warm cache's)
AHEAD_COPIES = 2.0
# under stale_weights, the update of the round before (its vector and its encoded bytes), stored as a round computes
# (slsml.pipeline.steps.worker.step)
STORING_COPIES = 2.0
# the sum as stored or read back (a round handed on): the archive's bytes beside it, while no micro-batch computes
ARCHIVE_COPIES = 2.0
GIB = 1024**3  # an accelerator's memory is given in GiB (functions.worker.accelerator_gib)
# on the GPU: model-sized buffers of a step, and the share of a sample's ``sample_bytes`` it takes by precision;
# measured as shares of the layer outputs alone (see the module's docstring), which ``sample_bytes`` exceeds (by 8%
# for ResNet-50 at 224×224): on a Keras model the device's figure errs high; mixed_float16 as mixed_bfloat16
DEVICE_MODEL_COPIES = 3.2
DEVICE_SAMPLE_SHARE = {"float32": 0.54, "mixed_float16": 0.26, "mixed_bfloat16": 0.26}


# at the backward pass's peak, beside the outputs kept: the gradients of the largest output and of its layer's input,
# and a fused activation's input (a layer's own output and what it computed it from), in outputs of the largest layer
BACKWARD_OUTPUTS = 3
INPUT_COPIES = 4  # a sample's input: as read, as the two micro-batches read ahead hold it, and as a tensor


def _values(tensors: Any) -> int:
    """The values of one sample of ``tensors`` (a symbolic tensor or a list of them)."""
    listed = tensors if isinstance(tensors, list | tuple) else [tensors]
    return sum(math.prod(d or 1 for d in t.shape[1:]) for t in listed)


def sample_bytes(model: Any) -> int:
    """What one sample adds to a training step of ``model`` (a Keras model), float32: every layer's output, kept for
    the backward pass, ``BACKWARD_OUTPUTS`` more of the largest, and ``INPUT_COPIES`` of its input; 0 where they are
    not known (a subclassed model's layers have no symbolic outputs)."""
    outputs = []
    for layer in model.layers:
        try:
            outputs.append(_values(layer.output))
        except (AttributeError, ValueError):
            return 0
    return step_bytes(outputs, _values(model.inputs))


def step_bytes(outputs: list[int], input_values: int) -> int:
    """What one sample adds to a training step of layers whose outputs hold ``outputs`` values each and whose input
    holds ``input_values`` (``sample_bytes``; a pipeline stage's, ``slsml.rounds.stages``), float32."""
    return 4 * (sum(outputs) + BACKWARD_OUTPUTS * max(outputs, default=0) + INPUT_COPIES * input_values)


@dataclass(frozen=True)
class WorkerMemory:
    """A worker's memory (MB of 2²⁰ bytes, as Lambda counts a function's) and what a step of its model takes of it."""

    memory_mb: float  # the function's
    cache_mb: float  # its warm cache's bound
    model_bytes: float  # the model's float32 weights
    sample_bytes: float  # what one sample adds to a step (``sample_bytes``)
    other_bytes: float = 0.0  # what it holds besides (``other_bytes``: a slot's state, a residual, a read ahead)

    def needed_mb(self, samples: int, micro_batches: int = 1) -> float:
        """The memory a step of ``samples`` at once takes, in a round of ``micro_batches`` per step, the cache full:
        with several, their float64 sum beside it, and the sum's archive in its place while the round is handed on."""
        held, step = MODEL_COPIES * self.model_bytes + self.other_bytes, samples * self.sample_bytes
        if micro_batches > 1:
            held += SUM_COPIES * self.model_bytes
            step = max(step, ARCHIVE_COPIES * self.model_bytes)
        return TF_RUNTIME_MB + self.cache_mb + (held + step) / MB

    def micro_batch(self) -> int:
        """The most samples a step of several micro-batches fits (0: not one)."""
        held = (MODEL_COPIES + SUM_COPIES) * self.model_bytes + self.other_bytes
        free = (self.memory_mb - TF_RUNTIME_MB - self.cache_mb) * MB - held
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
        buffers = (MODEL_COPIES + SUM_COPIES) * self.model_bytes / MB
        return (
            f"one sample's training step needs ~{self.needed_mb(1, micro_batches=2):,.0f} MB (the runtime"
            f" {TF_RUNTIME_MB:.0f} MB, the warm cache {self.cache_mb:,.0f} MB, the model's buffers {buffers:,.0f} MB,"
            f" a sample's layer outputs {self.sample_bytes / MB:,.1f} MB or, handing a round on, the archive of the"
            f" micro-batches' sum {ARCHIVE_COPIES * self.model_bytes / MB:,.0f} MB) and the worker has"
            f" {self.memory_mb:,.0f} MB: give the worker function more memory (a stack's functions.worker.memory_mb,"
            " up to 10240; --memory worker=MB locally)"
        )


@dataclass(frozen=True)
class AcceleratorMemory:
    """A GPU worker's accelerator memory and what a step of its model takes of it (``DEVICE_*``)."""

    accelerator_gib: int
    model_bytes: float  # the model's float32 weights
    sample_bytes: float  # one sample's float32 layer outputs (``sample_bytes``)
    precision: str  # float32, mixed_float16 or mixed_bfloat16

    @property
    def per_sample_bytes(self) -> float:
        """What one sample adds to a step on the GPU."""
        return DEVICE_SAMPLE_SHARE[self.precision] * self.sample_bytes

    def needed_bytes(self, samples: int) -> float:
        """The device memory a step of ``samples`` at once takes."""
        return DEVICE_MODEL_COPIES * self.model_bytes + samples * self.per_sample_bytes

    def micro_batch(self) -> int:
        """The most samples a step fits (0: not one)."""
        free = self.accelerator_gib * GIB - DEVICE_MODEL_COPIES * self.model_bytes
        if free < self.per_sample_bytes or free <= 0:
            return 0
        return math.floor(free / self.per_sample_bytes) if self.per_sample_bytes else 2**31

    def refusal(self) -> str | None:
        """Why not one sample fits the accelerator memory (None: one does)."""
        if self.micro_batch() >= 1:
            return None
        return (
            f"one sample's training step needs ~{self.needed_bytes(1) / GIB:,.1f} GiB of GPU memory ({self.precision}:"
            f" the model's buffers {DEVICE_MODEL_COPIES * self.model_bytes / GIB:,.1f} GiB, a sample"
            f" {self.per_sample_bytes / GIB:,.2f} GiB) and the worker has {self.accelerator_gib} GiB: give it more"
            " (a stack's functions.worker.accelerator_gib; --accelerator worker=GIB locally)"
        )


def of_accelerator(config: RunConfig, accelerator_gib: int) -> AcceleratorMemory:
    """The accelerator memory of a GPU worker of ``accelerator_gib`` training the run of ``config``, in its mixed
    precision policy (float32 without one)."""
    precision = config.training.mixed_precision or "float32"
    return AcceleratorMemory(accelerator_gib, 4 * config.plan.size, config.sample_bytes, precision)


def other_bytes(model_bytes: float, slot_bytes: float, residual_bytes: float, stale_weights: int) -> float:
    """What a worker holds beside a step besides the model's buffers: its slot's state and residual as read and as
    stored, and, under ``stale_weights``, the read of its next round's model under way (``AHEAD_COPIES``) and the
    update of its round before, stored as this one computes (``STORING_COPIES``)."""
    ahead = (AHEAD_COPIES + STORING_COPIES) * model_bytes if stale_weights else 0.0
    return 2 * slot_bytes + 2 * residual_bytes + ahead


def of_run(config: RunConfig, memory_mb: float, cache_mb: float, slot_bytes: int) -> WorkerMemory:
    """The memory of a worker of ``memory_mb`` with a warm cache of ``cache_mb`` training the run of ``config``,
    whose worker slots keep ``slot_bytes`` between rounds."""
    size = config.plan.size
    residual = feedback.residual_bytes(size) if config.training.compression.lossy else 0
    held = other_bytes(4 * size, slot_bytes, residual, config.training.stale_weights)
    return WorkerMemory(memory_mb, cache_mb, 4 * size, config.sample_bytes, held)


def micro_batch(
    config: RunConfig, memory_mb: float, cache_mb: float, slot_bytes: int, accelerator_gib: int | None = None
) -> int:
    """The run's micro-batch on a worker of ``memory_mb`` with a warm cache of ``cache_mb`` (``of_run``), or, with
    ``accelerator_gib``, on a GPU worker of that accelerator memory (``of_accelerator``), whose function's memory
    still holds the runtime, the warm cache and the model's buffers: the run's own (``micro_batch``), else the most
    samples that fit (a run of no per-sample figure: its shares whole). RunFailed, naming the memory needed, where
    not one sample fits."""
    if config.training.micro_batch is not None:
        return config.training.micro_batch
    if not config.sample_bytes:
        return config.training.global_batch
    host = of_run(config, memory_mb, cache_mb, slot_bytes)
    memory: WorkerMemory | AcceleratorMemory = host
    if accelerator_gib is not None:  # a step's layer outputs are the GPU's: the host holds none of them
        host, memory = replace(host, sample_bytes=0.0), of_accelerator(config, accelerator_gib)
    refusal = host.refusal() or memory.refusal()
    if refusal is not None:
        raise RunFailed(refusal)
    return memory.micro_batch()
