"""GPU workers on this machine, as a deployment's ``functions.worker.accelerator_gib`` gives them on Lambda Managed
Instances: each warm worker process sees one logical GPU of that memory (TensorFlow's logical device
configuration), so that W workers share the machine's GPU as W execution environments share an instance's; every
other function's processes, and every process where no accelerator is asked for, see no GPU, as a CPU function has
none."""

from __future__ import annotations

import shutil
import subprocess

from slsml.spec.errors import BadInputError

ACCELERATOR_ENV = "SLSML_ACCELERATOR_GIB"  # a warm process's accelerator memory; absent: a CPU function
ACCELERATED = ("worker",)  # the functions that may have an accelerator (the Worker's gradients are the GPU's work)
NO_GPU = (
    "TensorFlow sees no GPU on this machine: a local GPU worker needs an NVIDIA GPU and TensorFlow built with CUDA"
    " (pip install 'tensorflow[and-cuda]'); leave --accelerator out to train on the CPU"
)


def checked_accelerators(accelerator_gib: dict[str, int], processes: dict[str, int]) -> dict[str, int]:
    """``accelerator_gib`` (function → GiB) if this machine can give each of a function's ``processes`` (function →
    warm processes) a logical GPU of that memory; else ``BadInputError`` in one line naming what is missing."""
    if not accelerator_gib:
        return {}
    others = sorted(set(accelerator_gib) - set(ACCELERATED))
    if others:
        raise BadInputError(f"--accelerator {others[0]}=…: only the {' and '.join(ACCELERATED)} may have one")
    gpus = visible_gpus()
    if not gpus:
        raise BadInputError(f"--accelerator worker={accelerator_gib['worker']}: {NO_GPU}")
    wanted = sum(gib * processes.get(function, 1) for function, gib in accelerator_gib.items())
    card = gpu_card()
    total = None if card is None else card[1]
    if total is not None and wanted > total:
        raise BadInputError(
            f"--accelerator worker={accelerator_gib['worker']}: {processes.get('worker', 1)} warm worker processes"
            f" would hold {wanted} GiB of the GPU's {total:.0f} GiB; lower it or --pool"
        )
    return dict(accelerator_gib)


def visible_gpus() -> list[str]:
    """The GPUs TensorFlow sees on this machine (none with tensorflow-cpu or without a GPU)."""
    import tensorflow as tf

    return [device.name for device in tf.config.list_physical_devices("GPU")]


def gpu_card() -> tuple[str, float] | None:
    """The first GPU's name and memory in GiB, as its driver reports them; None where ``nvidia-smi`` is not at hand
    or lists none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    result = subprocess.run(
        [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return None
    name, memory_mib = (part.strip() for part in lines[0].rsplit(",", 1))
    return (name, int(memory_mib) / 1024) if memory_mib.isdigit() else None


def process_environment(accelerator_gib: int | None) -> dict[str, str]:
    """The variables of a warm process with ``accelerator_gib`` of GPU memory (None: a CPU function's, no GPU)."""
    if accelerator_gib is None:
        return {"CUDA_VISIBLE_DEVICES": "-1"}
    return {ACCELERATOR_ENV: str(accelerator_gib)}


def hold_process(accelerator_gib: int | None) -> None:
    """In a warm process, before TensorFlow first runs: its one logical GPU of ``accelerator_gib`` GiB, or none."""
    if accelerator_gib is None:
        return
    import tensorflow as tf

    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=accelerator_gib * 1024)]
    )
