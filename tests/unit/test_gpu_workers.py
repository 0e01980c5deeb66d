"""GPU workers on this machine: ``--accelerator worker=GIB`` is refused in one line where TensorFlow sees no GPU (and
for any function but the worker), ``slsml bench gpu`` exits 2 without a GPU, and its calibration gives each
accelerator memory the throughput of the largest micro-batch whose device memory peak fits it, and the fraction of the
card's published peak that achieves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slsml.bench import gpu
from slsml.cost.calibration import load_calibration
from slsml.local import accelerator
from slsml.spec.errors import BadInputError, SlsmlError

SLSML = [sys.executable, "-m", "slsml.cli.main"]
GIB = 1024**3
FLOPS = 23_000_000_000


def _slsml(*arguments: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run([*SLSML, *arguments], capture_output=True, text=True, timeout=300, env=environment, cwd=cwd)


def test_an_accelerator_is_refused_in_one_line_where_tensorflow_sees_no_gpu(tmp_path: Path) -> None:
    if accelerator.visible_gpus():  # a machine with a GPU: each warm worker process may hold a logical one
        assert accelerator.checked_accelerators({"worker": 3}, {"worker": 1}) == {"worker": 3}
        return
    done = _slsml("demo", "--accelerator", "worker=24", "--iterations", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"error: --accelerator worker=24: {accelerator.NO_GPU}"]
    assert not (tmp_path / ".slsml").exists()  # refused before anything started


def test_only_the_worker_takes_an_accelerator_and_only_a_size_lambda_offers(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"reducer=…: only the worker may have one"):
        accelerator.checked_accelerators({"reducer": 24}, {"reducer": 2})
    done = _slsml("local", "up", "--accelerator", "worker=5", cwd=tmp_path)
    assert done.returncode == 2
    assert "functions.worker.accelerator_gib=5: Input should be 3, 6, 12, 16, 24 or 48" in done.stderr


def test_bench_gpu_exits_2_saying_there_is_no_gpu(tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    done = _slsml(
        "bench", "gpu", "--out", str(out), cwd=tmp_path, path=str(Path(sys.executable).parent)
    )  # no nvidia-smi
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {gpu.NO_GPU}"
    assert not out.exists()


def _probe(precision: str, peaks_gib: dict[int, float], rate_per_sample: float) -> gpu.Probe:
    rows = tuple(
        gpu.Measured(batch=batch, samples_per_s=batch * rate_per_sample, peak_bytes=int(peak * GIB))
        for batch, peak in sorted(peaks_gib.items())
    )
    return gpu.Probe(
        precision=precision,  # type: ignore[arg-type]
        device="gpu",
        backend="tensorflow",
        params=25_636_712,
        rows=rows,
    )


def test_each_accelerator_memory_gets_the_largest_micro_batch_that_fits_it(tmp_path: Path) -> None:
    float32 = _probe("float32", {32: 2.6, 128: 9.8, 256: 19.4}, 10.0)
    bfloat16 = _probe("mixed_bfloat16", {32: 1.4, 128: 4.8, 256: 9.5}, 15.0)
    cpu = gpu.Probe(
        precision="float32",
        device="cpu",
        backend="tensorflow",
        params=25_636_712,
        rows=(gpu.Measured(batch=8, samples_per_s=7.0, peak_bytes=None),),
    )
    report = gpu.assembled("NVIDIA L4", 22.5, (float32, bfloat16), cpu, 224, FLOPS)
    calibration = report.calibration
    batches = {(e.accelerator_gib, e.precision): e.micro_batch for e in calibration.entries}
    assert batches == {
        (3, "float32"): 32,
        (3, "mixed_bfloat16"): 32,
        (6, "float32"): 32,
        (6, "mixed_bfloat16"): 128,
        (12, "float32"): 128,
        (12, "mixed_bfloat16"): 256,
        (16, "float32"): 128,
        (16, "mixed_bfloat16"): 256,
    }  # 24 and 48 GiB are past the card's 22.5
    assert calibration.samples_per_s(12, "mixed_bfloat16") == pytest.approx(256 * 15.0)
    assert calibration.samples_per_s(24, "float32") is None
    # the fraction of the L4's published peaks on its tensor cores: 60 TFLOPS float32 as TF32, 121 TFLOPS 16-bit
    assert calibration.fraction(12, "float32") == pytest.approx(128 * 10.0 * FLOPS / 60e12)
    assert calibration.card_fraction("mixed_bfloat16") == pytest.approx(256 * 15.0 * FLOPS / 121e12)
    assert calibration.train_flops_per_sample == FLOPS
    assert report.cpu_samples_per_s == 7.0
    written = tmp_path / "calibration.json"
    written.write_text(calibration.model_dump_json())
    assert load_calibration(written) == calibration


def test_a_file_that_is_not_a_calibration_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "calibration.json"
    bad.write_text('{"card": "L4"}')
    with pytest.raises(BadInputError, match=rf"^{bad}: not a GPU calibration"):
        load_calibration(bad)
    with pytest.raises(BadInputError, match="no such GPU calibration"):
        load_calibration(tmp_path / "missing.json")


def test_the_bench_counts_its_models_flops_in_a_tensorflow_process_of_its_own() -> None:
    import keras
    import numpy as np

    from slsml.cost import flops

    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=gpu.CLASSES)
    assert gpu._count_flops(64) == flops.count(model, np.zeros((1, 64, 64, 3), np.float32)).training


def test_without_tensorflow_the_bench_takes_the_count_recorded_of_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with Keras on JAX alone (no TensorFlow): the count tests/unit/test_flops.py checks against
    TensorFlow's, at the size it was counted; another size is refused, naming what it needs."""
    import importlib.util

    from slsml.cost import cards

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else found(name, *a))
    assert gpu._count_flops(gpu.IMAGE_SIZE) == cards.RESNET50_TRAIN_FLOPS
    with pytest.raises(SlsmlError, match="ResNet-50 at 64x64 needs TensorFlow"):
        gpu._count_flops(64)
