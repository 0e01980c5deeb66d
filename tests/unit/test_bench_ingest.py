"""bench's ingest pieces: the folder of photo-like images it writes, and the peak RSS of a command of its own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from slsml.bench import ingest as bench
from slsml.data import sources
from slsml.spec.errors import SlsmlError


def test_the_image_folder_is_mostly_jpeg_photos_with_some_png_in_class_folders(tmp_path: Path) -> None:
    written = bench.write_image_folder(tmp_path / "big", 10_000_000, classes=3)
    files = sorted(p for p in (tmp_path / "big").rglob("*") if p.is_file())
    assert written == sum(p.stat().st_size for p in files) >= 10_000_000
    jpegs, pngs = [p for p in files if p.suffix == ".jpg"], [p for p in files if p.suffix == ".png"]
    assert len(jpegs) + len(pngs) == len(files) and 0 < len(pngs) < len(jpegs) / 3
    sizes = np.array([p.stat().st_size for p in jpegs])
    assert 100_000 < np.median(sizes) < 200_000, "the noise keeps JPEG from compressing a photo to little"

    source = sources.open_source(tmp_path / "big")  # read as `slsml data put` reads it
    assert source.classes == ("class-0", "class-1", "class-2") and source.count() == len(files)
    x, y = next(source.chunks())
    assert x.shape[1:] == (256, 256, 3) and set(y.tolist()) == {0, 1, 2}
    assert all(image.std() > 20 for image in x), "each image has structure and noise, not one colour"
    assert len({image.tobytes() for image in x}) == len(x)

    bench.write_image_folder(tmp_path / "small", 1_000_000, classes=3)
    small = sorted(p for p in (tmp_path / "small").rglob("*") if p.is_file())
    assert 0 < len(small) < len(files)
    for path in small:  # the same seed writes the same files: a smaller folder is the first of them
        assert path.read_bytes() == (tmp_path / "big" / path.relative_to(tmp_path / "small")).read_bytes()


def test_the_peak_rss_is_the_command_s_own_whatever_this_process_held(tmp_path: Path) -> None:
    held = b"x" * (400 * 2**20)  # this process's peak: a child started from it directly would report it as its own
    del held

    def peak(mb: int) -> float:
        command = [sys.executable, "-c", f"held = b'x' * ({mb} * 2**20)"]
        return bench.peak_rss_mb(command, dict(os.environ), tmp_path / "log")

    small, big = peak(10), peak(110)
    assert 10 < small < 100 and 90 < big - small < 110
    with pytest.raises(SlsmlError, match="no such thing"):
        bench.peak_rss_mb(
            [sys.executable, "-c", "raise SystemExit('no such thing')"], dict(os.environ), tmp_path / "log"
        )
