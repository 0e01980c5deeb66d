"""Ingest measured: ``slsml data put`` of a source in a process of its own into a local deployment, its time, MB/s
and peak RSS; and a source to measure it on, a folder of photo-like images in class subfolders, mostly JPEG with some
PNG, of a chosen size on disk."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from slsml.aws.storage import ObjectStore
from slsml.data import catalog
from slsml.data import datasets as data
from slsml.local.cloud import LocalDeployment
from slsml.spec.errors import SlsmlError

PHOTO = (480, 640)  # a JPEG's height, width: about 150 KB each
PNG_SIZE = (256, 256)  # a PNG's: about 160 KB each
PNG_SHARE = 0.1  # of the images, drawn at random: PNGs
JPEG_QUALITY = 92
NOISE = 16.0  # the pixels' noise (standard deviation in levels): what keeps JPEG from compressing them to little
IMAGE_CLASSES = 10
PEAK_MB = 800.0  # an ingest's peak RSS is held to this, whatever the source's size

Kind = Literal["npy", "images"]  # a .npy of images and one of labels; a folder of image files


class Ingest(BaseModel):
    kind: Kind
    source_bytes: int  # of the files read
    samples: int  # stored, both splits
    seconds: float
    mb_s: float  # source bytes a second
    peak_rss_mb: float  # of the `slsml data put` process


class _Painter:
    """Photo-like RGB images: a coloured gradient, rectangles of flat colour and noise (a crop of one field of
    noise drawn once, so that an image costs a few milliseconds)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        height, width = max(PHOTO[0], PNG_SIZE[0]), max(PHOTO[1], PNG_SIZE[1])
        self.noise = self.rng.normal(0, NOISE, (2 * height, 2 * width, 3)).astype(np.float32)

    def paint(self, height: int, width: int) -> np.ndarray:
        rng = self.rng
        image = (
            rng.uniform(40, 215, 3).astype(np.float32)
            + np.linspace(-1, 1, height, dtype=np.float32)[:, None, None] * rng.uniform(-60, 60, 3).astype(np.float32)
            + np.linspace(-1, 1, width, dtype=np.float32)[None, :, None] * rng.uniform(-60, 60, 3).astype(np.float32)
        )
        for _ in range(8):
            top, left = rng.integers(0, height), rng.integers(0, width)
            image[top : top + rng.integers(8, height // 2), left : left + rng.integers(8, width // 2)] = rng.uniform(
                0, 255, 3
            )
        top, left = rng.integers(0, self.noise.shape[0] - height), rng.integers(0, self.noise.shape[1] - width)
        image += self.noise[top : top + height, left : left + width]
        return np.clip(image, 0, 255).astype(np.uint8)


def write_image_folder(folder: Path, total_bytes: int, classes: int = IMAGE_CLASSES, seed: int = 0) -> int:
    """Images in ``classes`` class subfolders of ``folder`` (``class-0`` …, in turn) until their files hold at least
    ``total_bytes``: ``PHOTO``-sized JPEGs and, a share ``PNG_SHARE`` of them drawn at random, ``PNG_SIZE`` PNGs.
    The same ``seed`` writes the same files, a smaller total the first of them. Returns the bytes written."""
    from PIL import Image

    painter, written, index = _Painter(seed), 0, 0
    for label in range(classes):
        (folder / f"class-{label}").mkdir(parents=True, exist_ok=True)
    while written < total_bytes:
        png = painter.rng.random() < PNG_SHARE
        encoded, image = io.BytesIO(), Image.fromarray(painter.paint(*(PNG_SIZE if png else PHOTO)))
        if png:
            image.save(encoded, "PNG", compress_level=1)
        else:
            image.save(encoded, "JPEG", quality=JPEG_QUALITY)
        path = folder / f"class-{index % classes}" / f"{index:07d}.{'png' if png else 'jpg'}"
        path.write_bytes(encoded.getbuffer())
        written, index = written + encoded.tell(), index + 1
    return written


# A child that subprocess starts (vfork, then exec) takes its parent's peak RSS as its own from the start: this
# process's (TensorFlow, the source written) would be counted as the ingest's. A small interpreter in between starts
# the command and prints its peak RSS (kilobytes on Linux), the command's own.
_PEAK = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def peak_rss_mb(command: list[str], env: dict[str, str], log: Path) -> float:
    """Run ``command`` in a process of its own (its stderr to ``log``) and return its peak RSS in MB, as
    ``/usr/bin/time -v`` shows it for the command run from a shell."""
    with log.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", _PEAK, *command], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    if done.returncode:
        raise SlsmlError(f"{' '.join(command[:5])} failed: {log.read_text()[-2000:]}")
    return int(done.stdout) / 1024


def measure(
    deployment: LocalDeployment,
    store: ObjectStore,
    name: str,
    kind: Kind,
    arguments: list[str],
    source_bytes: int,
    log: Path,
) -> Ingest:
    """``slsml data put NAME ARGUMENTS…`` into ``deployment``'s bucket (``store``) in a process of its own, its stderr
    to ``log``: its time, MB/s (of the ``source_bytes`` it reads) and peak RSS, and the samples stored."""
    command = [sys.executable, "-m", "slsml.cli.main", "data", "put", name, *arguments, "--bucket", deployment.bucket]
    started = time.perf_counter()
    peak_mb = peak_rss_mb(command, {**os.environ, **deployment.environment()}, log)
    seconds = time.perf_counter() - started
    manifest = data.load_manifest(store, name)
    return Ingest(
        kind=kind,
        source_bytes=source_bytes,
        samples=manifest.train.count + manifest.test.count,
        seconds=round(seconds, 3),
        mb_s=round(source_bytes / seconds / 1e6, 1),
        peak_rss_mb=round(peak_mb, 1),
    )


def image_folder(deployment: LocalDeployment, store: ObjectStore, name: str, gigabytes: float, work: Path) -> Ingest:
    """``measure`` the ingest of a ``write_image_folder`` of ``gigabytes`` written under ``work`` (its images resized
    to the default ``--image-size``), then remove the folder and the dataset."""
    folder = work / name
    try:
        written = write_image_folder(folder, round(gigabytes * 1e9))
        measured = measure(deployment, store, name, "images", [str(folder)], written, work / f"{name}.log")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    catalog.remove(store, name)
    return measured
