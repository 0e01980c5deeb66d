"""``slsml bench gpu``: a model's training throughput on this machine's GPU at each accelerator memory a GPU function
may have, float32 against mixed precision side by side, the fraction of the card's published peak that achieves (the
model's training FLOPs per sample, ``slsml.cost.flops``, × samples/s ÷ the peak of ``cards.DATASHEETS`` in that
precision), and the calibration ``slsml plan`` times GPU workers of this card by.

Each precision is measured in a process of its own (a fresh framework, its own memory statistics): training steps of
the model at growing micro-batches, each timed and its device memory peak read. An accelerator memory's throughput
is that of the largest micro-batch whose peak fits it: what one execution environment of that memory computes alone.
A CPU row (the GPU hidden, the same model) puts the GPU against the processor. Keras's own mixed precision is used:
``mixed_float16`` with its dynamic loss scaling, ``mixed_bfloat16`` without."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict

from slsml.cost import flops
from slsml.cost.calibration import GpuCalibration, GpuThroughput, Precision
from slsml.cost.cards import DATASHEETS, RESNET50_TRAIN_FLOPS, datasheet
from slsml.local import accelerator
from slsml.spec.deployment import FunctionSettings
from slsml.spec.errors import SlsmlError

PRECISIONS: tuple[Precision, ...] = ("float32", "mixed_float16", "mixed_bfloat16")
BATCHES = (16, 32, 64, 128, 256)  # micro-batches measured, ascending: each peak is at least the one before
CPU_BATCH = 8
IMAGE_SIZE = 224
CLASSES = 1000
STEPS = 8  # timed steps of each micro-batch, after two untimed ones (compilation, warm-up)
GIB = 1024**3
NO_GPU = "no NVIDIA GPU on this machine (nvidia-smi is not at hand or lists none): `slsml bench gpu` needs one"


def accelerator_sizes() -> tuple[int, ...]:
    """The accelerator memories a GPU function may have (``FunctionSettings.accelerator_gib``), in GiB."""
    annotation = FunctionSettings.model_fields["accelerator_gib"].annotation
    return next(get_args(arg) for arg in get_args(annotation) if get_origin(arg) is Literal)


class Measured(BaseModel):
    """One micro-batch's steps in one precision: throughput and the device memory they peaked at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int
    samples_per_s: float
    peak_bytes: int | None  # None on the CPU


class Probe(BaseModel):
    """What one process measured: its device, the framework's backend, and each micro-batch that fit the card."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision
    device: Literal["gpu", "cpu"]
    backend: str
    params: int
    rows: tuple[Measured, ...]


class GpuReport(BaseModel):
    """The bench's figures: the calibration, each probe's rows, and the CPU's throughput beside them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibration: GpuCalibration
    card_gib: float
    backend: str
    probes: tuple[Probe, ...]
    cpu_samples_per_s: float | None


def card() -> tuple[str, float]:
    """The first GPU's name and memory in GiB, as its driver reports them; ``SlsmlError`` where there is none."""
    found = accelerator.gpu_card()
    if found is None:
        raise SlsmlError(NO_GPU)
    return found


def measure(
    precisions: tuple[Precision, ...] = PRECISIONS,
    batches: tuple[int, ...] = BATCHES,
    image_size: int = IMAGE_SIZE,
    cpu: bool = True,
    show: Callable[[str, int, int], None] = lambda name, done, total: None,
) -> GpuReport:
    """ResNet-50 at ``image_size``² (``CLASSES`` classes) trained at each of ``batches`` in each of ``precisions`` on
    the GPU, and at ``CPU_BATCH`` on the CPU where ``cpu``; the calibration of every accelerator memory the card has.
    ``SlsmlError`` where there is no GPU or its card's peak is not published (``cards.DATASHEETS``)."""
    driver_name, card_gib = card()
    sheet = datasheet(driver_name)
    if sheet is None:
        known = ", ".join(sheet.card for sheet in DATASHEETS)
        raise SlsmlError(f"{driver_name}: no published peak of this card in slsml (cards.DATASHEETS: {known})")
    name = sheet.card  # as the plan's instance types name it
    probes = []
    for precision in precisions:
        show(f"{precision} on {name}", 0, 1)
        probes.append(_probe(precision, "gpu", batches, image_size))
        show(f"{precision} on {name}", 1, 1)
    show("counting the model's FLOPs", 0, 1)
    counted = _count_flops(image_size)
    show("counting the model's FLOPs", 1, 1)
    cpu_probe = None
    if cpu:
        show("float32 on the CPU", 0, 1)
        cpu_probe = _probe("float32", "cpu", (CPU_BATCH,), image_size)
        show("float32 on the CPU", 1, 1)
    return assembled(name, card_gib, tuple(probes), cpu_probe, image_size, counted)


def assembled(
    name: str, card_gib: float, probes: tuple[Probe, ...], cpu_probe: Probe | None, image_size: int, flops: int
) -> GpuReport:
    """The report of ``probes`` on the GPU ``name`` of ``card_gib`` (and ``cpu_probe``'s rate beside them) of a model
    of ``flops`` a training sample: every accelerator memory the card has, at the throughput of the largest
    micro-batch that fits it, and the fraction of the card's peak that is."""
    entries = [
        GpuThroughput(
            accelerator_gib=size,
            precision=probe.precision,
            micro_batch=row.batch,
            samples_per_s=row.samples_per_s,
            achieved_fraction=achieved(name, probe.precision, row.samples_per_s, flops),
        )
        for size in accelerator_sizes()
        if size <= card_gib
        for probe in probes
        if (row := _fitting(probe, size)) is not None
    ]
    calibration = GpuCalibration(
        card=name,
        model=f"ResNet50 {image_size}x{image_size}x3, {CLASSES} classes ({probes[0].backend} backend)",
        params=probes[0].params,
        train_flops_per_sample=flops,
        sample_shape=(image_size, image_size, 3),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        entries=tuple(entries),
    )
    return GpuReport(
        calibration=calibration,
        card_gib=card_gib,
        backend=probes[0].backend,
        probes=probes,
        cpu_samples_per_s=None if cpu_probe is None else max(row.samples_per_s for row in cpu_probe.rows),
    )


def achieved(card_name: str, precision: Precision, samples_per_s: float, flops: int) -> float | None:
    """The fraction of ``card_name``'s published peak in ``precision`` that ``samples_per_s`` of ``flops`` each
    achieve; None where the peak is not published."""
    sheet = datasheet(card_name)
    peak = None if sheet is None else sheet.tflops(precision)
    return None if peak is None else samples_per_s * flops / (peak * 1e12)


def _fitting(probe: Probe, size_gib: int) -> Measured | None:
    """The largest micro-batch whose device memory peak fits ``size_gib``; None if none does."""
    fits = [row for row in probe.rows if row.peak_bytes is not None and row.peak_bytes <= size_gib * GIB]
    return max(fits, key=lambda row: row.batch) if fits else None


def _model(image_size: int) -> Any:
    """The model measured: Keras's ResNet-50 at ``image_size``² × 3, ``CLASSES`` classes, untrained."""
    import keras

    return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3), classes=CLASSES)


def _count_flops(image_size: int) -> int:
    """The model's training FLOPs per sample, counted by TensorFlow on the CPU in a process of its own (whatever
    backend the probes train on, and none of the GPU's memory taken): ``python -m slsml.bench.gpu flops SIZE``. On a
    machine without TensorFlow (a JAX backend alone), the count recorded of the model at ``IMAGE_SIZE``
    (``cards.RESNET50_TRAIN_FLOPS``); another size needs TensorFlow."""
    if importlib.util.find_spec("tensorflow") is None:
        if image_size == IMAGE_SIZE:
            return RESNET50_TRAIN_FLOPS
        raise SlsmlError(
            f"counting the FLOPs of ResNet-50 at {image_size}x{image_size} needs TensorFlow (pip install tensorflow);"
            f" without it, measure at {IMAGE_SIZE}, whose count slsml records"
        )
    environment = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "-1",
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    result = subprocess.run(
        [sys.executable, "-m", "slsml.bench.gpu", "flops", str(image_size)],
        capture_output=True,
        text=True,
        env=environment,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines or not lines[-1].isdigit():
        why = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SlsmlError(f"counting the model's FLOPs failed: {why}")
    return int(lines[-1])


def _probe(precision: Precision, device: str, batches: tuple[int, ...], image_size: int) -> Probe:
    """One precision measured in a process of its own (``python -m slsml.bench.gpu``)."""
    hidden = {"CUDA_VISIBLE_DEVICES": "-1", "JAX_PLATFORMS": "cpu"} if device == "cpu" else {}
    environment = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_CPP_MIN_LOG_LEVEL": "2", **hidden}
    arguments = [precision, device, ",".join(map(str, batches)), str(image_size)]
    result = subprocess.run(
        [sys.executable, "-m", "slsml.bench.gpu", *arguments], capture_output=True, text=True, env=environment
    )
    measured = result.stdout.strip().splitlines()
    if result.returncode != 0 or not measured:
        lines = result.stderr.strip().splitlines() or ["no output"]
        why = lines[-1] if result.returncode != 0 else f"not even micro-batch {min(batches)} fits the card"
        raise SlsmlError(f"measuring {precision} on the {device} failed: {why}")
    return Probe.model_validate_json(measured[-1])


def _run_probe(
    precision: Precision,
    device: Literal["gpu", "cpu"],
    batches: list[int],
    image_size: int,
    emit: Callable[[Probe], None],
) -> None:
    """In the probe's process: the steps of each micro-batch, until one does not fit the card; ``emit`` gets the
    probe so far after each (the last it got stands, were the process ended early)."""
    import keras
    import numpy as np

    if device == "gpu" and not _framework_sees_gpu(keras.backend.backend()):
        raise SystemExit(f"Keras's {keras.backend.backend()} backend sees no GPU: it needs a build with CUDA")
    keras.mixed_precision.set_global_policy(precision)
    model = _model(image_size)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    rows = []
    for batch in sorted(batches):
        x = rng.random((batch, image_size, image_size, 3), dtype=np.float32)
        y = rng.integers(0, CLASSES, batch)
        try:
            for _ in range(2):
                model.train_on_batch(x, y)  # the loss comes back to the host: each step has ended
            started = time.perf_counter()
            for _ in range(STEPS):
                model.train_on_batch(x, y)
            elapsed = time.perf_counter() - started
        except Exception as error:  # the card's memory is spent: the larger micro-batches cannot fit either
            if not _out_of_memory(error):
                raise
            break
        peak = _peak_bytes(keras.backend.backend()) if device == "gpu" else None
        rows.append(Measured(batch=batch, samples_per_s=batch * STEPS / elapsed, peak_bytes=peak))
        emit(
            Probe(
                precision=precision,
                device=device,
                backend=keras.backend.backend(),
                params=model.count_params(),
                rows=tuple(rows),
            )
        )


def _framework_sees_gpu(backend: str) -> bool:
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if backend == "jax":
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    raise SystemExit(f"the {backend} backend is not measured: use tensorflow or jax")


def _peak_bytes(backend: str) -> int:
    """The most device memory the framework has held since the process started."""
    if backend == "tensorflow":
        import tensorflow as tf

        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    import jax

    return int(jax.local_devices()[0].memory_stats()["peak_bytes_in_use"])


def _out_of_memory(error: Exception) -> bool:
    text = f"{type(error).__name__} {error}"
    return any(mark in text for mark in ("RESOURCE_EXHAUSTED", "ResourceExhausted", "out of memory", "OOM"))


def _main(arguments: list[str]) -> None:
    if arguments[0] == "flops":
        import numpy as np

        size = int(arguments[1])
        print(flops.count(_model(size), np.zeros((1, size, size, 3), np.float32)).training)
        return
    precision, device, batches, image_size = arguments
    precision_given = next(p for p in PRECISIONS if p == precision)
    device_given: Literal["gpu", "cpu"] = "cpu" if device == "cpu" else "gpu"
    _run_probe(
        precision_given,
        device_given,
        [int(b) for b in batches.split(",")],
        int(image_size),
        lambda probe: print(json.dumps(probe.model_dump(mode="json")), flush=True),
    )


if __name__ == "__main__":
    _main(sys.argv[1:])
