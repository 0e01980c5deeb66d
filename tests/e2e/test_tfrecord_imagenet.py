"""An ImageNet-layout TFRecord put as a user would against `slsml local up`: shards of JPEG-encoded photo-like
images (suffix-less, ``train-00000-of-00002``) with 1-based labels go through `slsml data put … --format tfrecord
--label-offset 1 --image-size 32,32`, which says what it found in the records, and a CNN trains on them with
`run start --local --data NAME` to a test accuracy of at least 0.9."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from ..unit.test_tfrecord_images import imagenet_example, write_records
from .service import last_json, slsml
from .test_ingest import service  # noqa: F401 (the module's local service, with the CNN in its folder)

IMAGES = 200  # half of each class


def photo_like(label: int, rng: np.random.Generator) -> bytes:
    """A 40×40 JPEG of a lit, noisy scene: class 1 a bright warm disc on a warm gradient, class 2 a dark bar on a
    cool one, each placed, sized and lit at random."""
    rows, columns = np.mgrid[0:40, 0:40] / 40.0
    slope = rng.uniform(0.3, 1.0) * (rows if rng.random() < 0.5 else columns)
    warm, cool = np.array([200.0, 110, 50]), np.array([40.0, 120, 190])
    scene = (warm if label == 1 else cool) * (0.6 + 0.4 * slope[..., None])
    centre, size = rng.uniform(10, 30, 2), rng.uniform(5, 12)
    if label == 1:
        shape = np.hypot(rows * 40 - centre[0], columns * 40 - centre[1]) < size
        scene[shape] = [250, 220, 120]
    else:
        shape = (np.abs(rows * 40 - centre[0]) < size / 3) & (np.abs(columns * 40 - centre[1]) < size)
        scene[shape] = [20, 40, 70]
    scene = scene * rng.uniform(0.7, 1.2) + rng.normal(0, 12, scene.shape)
    data = io.BytesIO()
    Image.fromarray(np.clip(scene, 0, 255).astype(np.uint8)).save(data, format="JPEG", quality=85)
    return data.getvalue()


def test_imagenet_tfrecord_shards_are_put_and_train_a_cnn(service: Path) -> None:  # noqa: F811
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(IMAGES) % 2 + 1)  # ImageNet's labels count from 1
    records = [imagenet_example(photo_like(int(label), rng), int(label), rng) for label in labels]
    write_records(service / "imagenet" / "train-00000-of-00002", records[: IMAGES // 2])
    write_records(service / "imagenet" / "train-00001-of-00002", records[IMAGES // 2 :])

    put = slsml(
        service,
        "data",
        "put",
        "imagenet",
        "imagenet",
        "--format",
        "tfrecord",
        "--label-offset",
        "1",
        "--image-size",
        "32,32",
        "--json",
    )
    assert "found: image/encoded JPEG images, label image/class/label (int64)" in put.stderr.splitlines()
    shown = last_json(put)
    assert shown["format"] == "tfrecord" and shown["train"] + shown["test"] == IMAGES
    assert shown["x_shape"] == [32, 32, 3] and shown["x_dtype"] == "uint8"

    summary = last_json(
        slsml(
            service,
            "run",
            "start",
            "--local",
            "--model",
            "cnn.keras",
            "--data",
            "imagenet",
            "--iterations",
            "30",
            "--batch",
            "32",
            "--workers",
            "2",
            "--eval-every",
            "30",
            "--json",
        )
    )
    assert summary["status"] == "COMPLETED" and summary["test_accuracy"] >= 0.9, summary
